"""Kafka's admin operations on a store: CreatePartitions, AlterConfigs, IncrementalAlterConfigs,
DeleteRecords, DescribeLogDirs and ElectLeaders, answered as Kafka's broker answers them.

- **CreatePartitions** grows a topic (:meth:`LogStore.create_partitions`): the new partitions
  are empty. Kafka's errors: UNKNOWN_TOPIC_OR_PARTITION, INVALID_PARTITIONS for a count that
  does not grow, INVALID_REPLICA_ASSIGNMENT for an assignment of the wrong shape or not naming
  the brokers every partition is on (``KafkaApis.replica_nodes``: this broker; a replica set's
  voters), INVALID_REQUEST for a topic named twice in one request, and for the internal
  topics, whose single partition the coordinators rely on. ``validate_only`` checks and
  changes nothing.
- **AlterConfigs** replaces a topic's whole set of overrides, **IncrementalAlterConfigs**
  changes some (SET, DELETE, APPEND and SUBTRACT for a list config such as
  ``cleanup.policy``); the rules are :mod:`logstore.kafka.configs`', the change
  :meth:`LogStore.alter_topic_config`'s (durable, and taken by the open logs at once). A
  group's configs (resource type GROUP) go to the store's group config file
  (:mod:`logstore.kafka.groupconfigfile`) and count from its members' next heartbeat.
- **DeleteRecords** moves a partition's log start (``Log.delete_records_before``, durable):
  -1 means the high watermark, an offset past it is OFFSET_OUT_OF_RANGE, a topic whose
  cleanup.policy lacks ``delete`` is POLICY_VIOLATION (as Kafka); the answer is the new low
  watermark (log start offset). On a replica set the leader answers once its followers in
  sync moved theirs (the ``move_log_start`` it is given).
- **DescribeLogDirs** names the store's root as the broker's one log directory, with each
  partition it holds (on a replica set, followed ones too), its size, its offset lag (as Kafka
  computes it for a current replica: how far its log end is behind its high watermark, so 0)
  and, from v4, the file system's total and usable bytes.
- **ElectLeaders** (KIP-183, KIP-460): every partition already has its leader, the one this
  broker is (a replica set's elected one: it has no preferred replica to move leadership to),
  so each partition named gets ELECTION_NOT_NEEDED and an unknown one
  UNKNOWN_TOPIC_OR_PARTITION; asked for all partitions, the answer lists none, as Kafka lists
  only the partitions whose leader it changed. A preferred and an unclean election (v1+'s
  ``election_type`` 0 and 1) are answered alike; another type is INVALID_REQUEST.

On a replica set (:class:`~logstore.replica.metadata.ReplicaAdminApis`) the changes of
CreatePartitions and of topic configs go through the set's replicated metadata instead of this
store alone (the hooks :meth:`AdminApis.grow_topic`, :meth:`~AdminApis.alter_topic`,
:meth:`~AdminApis.resource_refusal`): NOT_CONTROLLER when the node no longer leads it,
REQUEST_TIMED_OUT when no majority took the change in time.

Thread-safety: every handler may run on several threads at once; the store serialises topic
changes (its metadata lock) and each log its own.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future
from typing import Any, Callable

from ..errorcodes import ErrorCode
from ..net.purgatory import when_settled
from ..store.kafkadirs import is_internal_topic
from ..store.topicids import ZERO_TOPIC_ID
from ..errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    LogstoreError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from . import configs as kafkaconfigs
from .wire import KafkaRequest

__all__ = ["AdminApis", "refused"]

logger = logging.getLogger("logstore.kafka")

def refused(request: KafkaRequest, message: str, error: int = ErrorCode.policy_violation) -> dict[str, Any]:
    """The answer refusing every item of a CreateTopics, CreatePartitions, AlterConfigs or
    IncrementalAlterConfigs request with ``error`` (POLICY_VIOLATION by default) and
    ``message``: e.g. a replica set's answer when no node leads its metadata (NOT_CONTROLLER)."""
    body = request.body
    if request.api_key == 37:
        return {"throttle_time": 0, "results": [{"name": t.name, "error_code": error, "error_message": message}
                                                for t in body.topics]}
    if request.api_key == 19:  # CreateTopics
        return {"throttle_time": 0, "topics": [
            {"name": t.name, "error_code": error, "error_message": message, "topic_id": ZERO_TOPIC_ID,
             "num_partitions": -1, "replication_factor": -1, "configs": []} for t in body.topics]}
    return {"throttle_time": 0, "responses": [
        {"error_code": error, "error_message": message, "resource_type": r.resource_type,
         "resource_name": r.resource_name} for r in body.resources]}


class AdminApis:
    """The admin handlers of one :class:`~logstore.kafka.apis.KafkaApis` (see the module
    docstring): they act on its store and ask it (:meth:`KafkaApis.partition_error`) whether
    this broker answers for a partition. (``apis`` is untyped here: kafka.apis imports this
    module, and no import may go round a circle.)"""

    def __init__(self, apis: Any, move_log_start: Callable[[str, int, Any, int, float], Any] | None = None) -> None:
        self.apis = apis
        self.store = apis.store
        #: ``move(topic, partition, log, offset, timeout_s)``: DeleteRecords' move of a log
        #: start (at most its high watermark; checked), returning (error code, low watermark)
        #: or a Future of it: the log's own by default; a replica set's leader waits for its
        #: followers
        self.move_log_start = move_log_start or _move_log_start

    # ------------------------------------------------------------------ the changes
    # (hooks: a replica set's replicate them)
    def grow_topic(self, name: str, count: int, validate_only: bool) -> None:
        """Grow ``name`` to ``count`` partitions (:meth:`LogStore.create_partitions`, whose
        errors it raises)."""
        self.store.create_partitions(name, count, validate_only=validate_only)

    def alter_topic(self, name: str, edit: Callable[[dict[str, str]], Any], validate_only: bool) -> None:
        """Replace ``name``'s overrides by ``edit(current)`` (:meth:`LogStore.alter_topic_config`,
        whose errors it raises)."""
        self.store.alter_topic_config(name, edit, validate_only=validate_only)

    def resource_refusal(self, resource_type: int, resource_name: str) -> tuple[int, str] | None:
        """(error code, message) refusing every config change of the resource here, or None:
        none refused (a replica set refuses what it does not replicate, and its internal
        topics')."""
        return None

    # ------------------------------------------------------------------ CreatePartitions
    def on_create_partitions(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        names = [t.name for t in body.topics]
        results = []
        for topic in body.topics:
            if names.count(topic.name) > 1:
                error, message = ErrorCode.invalid_request, "Duplicate topic in request."
            else:
                error, message = self._create_partitions(topic.name, topic.count, topic.assignments,
                                                         body.validate_only)
            results.append({"name": topic.name, "error_code": error, "error_message": message})
        return {"throttle_time": 0, "results": results}

    def _create_partitions(self, name: str, count: int, assignments: Any,
                           validate_only: bool) -> tuple[int, str | None]:
        try:
            current = self.store.partitions_for(name)
        except (UnknownTopicOrPartitionError, InvalidTopicError):
            return ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist"
        if is_internal_topic(name):
            return ErrorCode.invalid_request, f"internal topic {name!r} keeps its {current} partition(s)"
        if count < current:
            return ErrorCode.invalid_partitions, (f"Topic currently has {current} partitions, which is higher than "
                                                  f"the requested {count}.")
        if count == current:
            return ErrorCode.invalid_partitions, f"Topic already has {current} partitions."
        if assignments is not None:
            if len(assignments) != count - current:
                return ErrorCode.invalid_replica_assignment, (
                    f"Attempted to add {count - current} additional partition(s), but only {len(assignments)} "
                    "assignment(s) were specified.")
            replicas = sorted(self.apis.replica_nodes())
            for assignment in assignments:
                brokers = list(assignment.broker_ids)
                if sorted(brokers) != replicas or len(set(brokers)) != len(brokers):
                    return ErrorCode.invalid_replica_assignment, (
                        f"assignment {brokers} does not name the brokers every partition is on: {replicas}")
        try:
            self.grow_topic(name, count, validate_only)
        except UnknownTopicOrPartitionError:
            return ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist"
        except InvalidPartitionsError as exc:  # grown meanwhile, or too many
            return ErrorCode.invalid_partitions, str(exc)
        except (NotLeaderOrFollowerError, RequestTimedOutError) as exc:  # a replica set's metadata leader
            return _replication_error(exc)
        except (OSError, LogstoreError) as exc:
            logger.error("CreatePartitions of %s to %d failed: %s", name, count, exc)
            return ErrorCode.kafka_storage_error, str(exc)
        return ErrorCode.none, None

    # ------------------------------------------------------------------ configs
    def on_alter_configs(self, request: KafkaRequest) -> dict[str, Any]:
        return self._alter(request, incremental=False)

    def on_incremental_alter_configs(self, request: KafkaRequest) -> dict[str, Any]:
        return self._alter(request, incremental=True)

    def _alter(self, request: KafkaRequest, incremental: bool) -> dict[str, Any]:
        body = request.body
        keys = [(r.resource_type, r.resource_name) for r in body.resources]
        responses = []
        for resource in body.resources:
            refusal = self.resource_refusal(resource.resource_type, resource.resource_name)
            if keys.count((resource.resource_type, resource.resource_name)) > 1:
                error, message = ErrorCode.invalid_request, "Duplicate resource in request."
            elif refusal is not None:
                error, message = refusal
            else:
                changes = [(c.name, getattr(c, "config_operation", kafkaconfigs.SET), c.value)
                           for c in resource.configs]
                error, message = self._alter_resource(resource.resource_type, resource.resource_name, changes,
                                                      incremental, body.validate_only)
            responses.append({"error_code": error, "error_message": message,
                              "resource_type": resource.resource_type, "resource_name": resource.resource_name})
        return {"throttle_time": 0, "responses": responses}

    def _alter_resource(self, resource_type: int, name: str, changes: list[tuple[str, int, str | None]],
                        incremental: bool, validate_only: bool) -> tuple[int, str | None]:
        if resource_type == kafkaconfigs.BROKER:
            return kafkaconfigs.alter_broker(self.store, self.apis.node_id, name, self.apis.broker_settings(), changes,
                                             incremental, validate_only)
        if resource_type == kafkaconfigs.GROUP:
            return self._alter_group(name, changes, incremental, validate_only)
        if resource_type != kafkaconfigs.TOPIC:
            return ErrorCode.invalid_request, f"resource type {resource_type} has no configs to alter here"
        refused = kafkaconfigs.check_topic_changes(changes, incremental)
        if refused is not None:
            return refused
        try:
            self.alter_topic(name, lambda current: kafkaconfigs.store_keywords(
                kafkaconfigs.apply_changes(self.store.defaults, current, changes, incremental)), validate_only)
        except (UnknownTopicOrPartitionError, InvalidTopicError):
            return ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist"
        except (InvalidConfigError, TypeError, ValueError) as exc:
            return ErrorCode.invalid_config, str(exc)
        except (NotLeaderOrFollowerError, RequestTimedOutError) as exc:  # a replica set's metadata leader
            return _replication_error(exc)
        except (OSError, LogstoreError) as exc:
            logger.error("altering the configs of %s failed: %s", name, exc)
            return ErrorCode.kafka_storage_error, str(exc)
        return ErrorCode.none, None

    def _alter_group(self, name: str, changes: list[tuple[str, int, str | None]], incremental: bool,
                     validate_only: bool) -> tuple[int, str | None]:
        """A group's own configs changed (:func:`~logstore.kafka.configs.alter_group`'s rules),
        kept durably in the store's group config file; its members take them at their next
        heartbeat."""
        if self.apis.consumer_group_config is None:
            return ErrorCode.invalid_config, ("group configs apply to consumer groups (KIP-848), which this broker "
                                              "does not serve (group.coordinator.rebalance.protocols=classic)")

        def change(current: Any) -> tuple[Any, tuple[int, str | None]]:
            error, message, new = kafkaconfigs.alter_group(name, current, changes, incremental,
                                                           self.apis.group_settings())
            return (new if error == ErrorCode.none and not validate_only else None), (error, message)
        try:
            return self.apis.group_configs.update(name, change)
        except (OSError, LogstoreError) as exc:
            logger.error("altering the configs of group %s failed: %s", name, exc)
            return ErrorCode.kafka_storage_error, str(exc)

    # ------------------------------------------------------------------ DeleteRecords
    def on_delete_records(self, request: KafkaRequest) -> dict[str, Any] | Future:
        timeout_s = max(_seconds(request.body.timeout), 0.0)
        topics = []
        waiting: list[tuple[dict[str, Any], Future]] = []
        for topic in request.body.topics:
            partitions = []
            for p in topic.partitions:
                entry = {"partition_index": p.partition_index, "low_watermark": -1, "error_code": ErrorCode.none}
                outcome = self._delete_records(topic.name, p.partition_index, p.offset, timeout_s)
                if isinstance(outcome, Future):
                    waiting.append((entry, outcome))
                else:
                    entry["error_code"], entry["low_watermark"] = outcome
                partitions.append(entry)
            topics.append({"name": topic.name, "partitions": partitions})
        answer = {"throttle_time": 0, "topics": topics}
        return answer if not waiting else when_settled(answer, waiting, _fill_low_watermark)

    def _delete_records(self, topic: str, partition: int, offset: int,
                        timeout_s: float) -> tuple[int, int] | Future:
        """(error code, low watermark) of one partition's DeleteRecords, or a Future of it."""
        refused = self.apis.partition_error(topic, partition)
        if refused:
            return refused, -1
        try:
            log = self.store.partition(topic, partition)
        except (UnknownTopicOrPartitionError, InvalidTopicError):
            return ErrorCode.unknown_topic_or_partition, -1
        if not log.config.deletes:  # Kafka: records of a compact-only topic are not deleted
            logger.info("DeleteRecords of %s-%d refused: cleanup.policy=%s", topic, partition, log.config.cleanup_policy)
            return ErrorCode.policy_violation, -1
        hw = log.high_watermark
        target = hw if offset == -1 else offset
        if target < 0 or target > hw:
            return ErrorCode.offset_out_of_range, -1
        try:
            return self.move_log_start(topic, partition, log, target, timeout_s)  # type: ignore[no-any-return]
        except OffsetOutOfRangeError:
            return ErrorCode.offset_out_of_range, -1
        except (OSError, LogstoreError) as exc:
            logger.error("DeleteRecords of %s-%d before %d failed: %s", topic, partition, target, exc)
            return ErrorCode.kafka_storage_error, -1

    # ------------------------------------------------------------------ DescribeLogDirs
    def on_describe_log_dirs(self, request: KafkaRequest) -> dict[str, Any]:
        wanted = request.body.topics
        if wanted is None:
            chosen = [(name, range(self._count(name))) for name in self.store.topics(internal=True)]
        else:
            chosen = [(t.topic, t.partitions) for t in wanted]
        topics = []
        for name, indexes in chosen:
            partitions = []
            for index in indexes:  # every replica this broker holds, led or followed, as Kafka's
                try:
                    log = self.store.partition(name, index)
                    size, lag = log.size_in_bytes, max(log.high_watermark - log.log_end_offset, 0)
                except (UnknownTopicOrPartitionError, InvalidTopicError):
                    continue  # Kafka leaves out what the directory does not hold
                partitions.append({"partition_index": index, "partition_size": size, "offset_lag": lag,
                                   "is_future_key": False})
            if partitions:
                topics.append({"name": name, "partitions": partitions})
        try:
            disk = os.statvfs(self.store.root)
            total, usable = disk.f_blocks * disk.f_frsize, disk.f_bavail * disk.f_frsize
        except OSError:
            total = usable = -1
        return {"throttle_time": 0, "error_code": ErrorCode.none,
                "results": [{"error_code": ErrorCode.none, "log_dir": self.store.root, "topics": topics,
                             "total_bytes": total, "usable_bytes": usable}]}

    def on_elect_leaders(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        election_type = getattr(body, "election_type", 0)
        answer: dict[str, Any] = {"throttle_time": 0, "error_code": ErrorCode.none, "replica_election_results": []}
        if election_type not in (0, 1):  # 0: preferred, 1: unclean
            answer["error_code"] = ErrorCode.invalid_request
            return answer
        if body.topic_partitions is None:
            return answer
        for topic in body.topic_partitions:
            count = self._count(topic.topic)
            results = []
            for index in topic.partitions:
                if 0 <= index < count:
                    error, message = ErrorCode.election_not_needed, "the partition's leader is already its leader"
                else:
                    error, message = ErrorCode.unknown_topic_or_partition, f"{topic.topic}-{index} does not exist"
                results.append({"partition_id": index, "error_code": error, "error_message": message})
            answer["replica_election_results"].append({"topic": topic.topic, "partition_result": results})
        return answer

    def _count(self, name: str) -> int:
        try:
            return self.store.partitions_for(name)
        except (UnknownTopicOrPartitionError, InvalidTopicError):
            return 0  # deleted meanwhile


def _move_log_start(topic: str, partition: int, log: Any, offset: int, timeout_s: float) -> tuple[int, int]:
    """A single store's DeleteRecords: the log moves its start (durable on return)."""
    return ErrorCode.none, log.delete_records_before(offset)


def _seconds(value: Any) -> float:
    """Seconds of a kio duration (a timedelta) or milliseconds as an int."""
    return value.total_seconds() if hasattr(value, "total_seconds") else int(value) / 1000.0


def _fill_low_watermark(entry: dict[str, Any], future: Future) -> None:
    """A DeleteRecords partition's answer from its move's (error code, low watermark)
    (REQUEST_TIMED_OUT for an exception)."""
    if future.exception() is None:
        entry["error_code"], entry["low_watermark"] = future.result()
    else:
        entry["error_code"] = ErrorCode.request_timed_out


def _replication_error(exc: LogstoreError) -> tuple[int, str]:
    """A replicated change that did not commit: NOT_CONTROLLER when this node does not (or no
    longer) lead the metadata (Kafka's admin clients look for the controller again and retry),
    REQUEST_TIMED_OUT when no majority took it in time (it may still commit)."""
    if isinstance(exc, NotLeaderOrFollowerError):
        return ErrorCode.not_controller, str(exc)
    return ErrorCode.request_timed_out, str(exc)
