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
  for an append, through this server or by any process sharing the store.
- Metadata names this one broker as the leader, replica and in-sync replica of every
  partition; a topic asked for that does not exist is created when the server auto-creates
  topics (Kafka's ``auto.create.topics.enable``).
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
import threading
from dataclasses import replace
from concurrent.futures import Future
from typing import Any, Callable, Mapping

from .._fileio import FileRegion
from ..errorcodes import ErrorCode, code_for
from ..errors import (
    CorruptRecordError,
    InvalidConfigError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTopicError,
    LogstoreError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from . import configs as kafkaconfigs
from .._native import lib
from ..log.config import LogConfig
from ..records.batch import decode_batches, parse_header
from ..txn.producerids import ProducerIds
from ..groups.offsets import OFFSETS_TOPIC, offset_store
from ..groups.coordinator import GroupConfig, GroupCoordinator
from .wire import SUPPORTED, KafkaRequest
from ..net.purgatory import Purgatory
from ..store.store import LogStore
from ..txn.coordinator import TransactionCoordinator, TxnConfig
from ..txn.local import store_coordinator

__all__ = ["KafkaApis", "one_v2_batch_problem"]

logger = logging.getLogger("logstore.kafka")

#: A fetched partition's offsets when it is answered with an error (Kafka's: unknown).
_NO_OFFSETS = {"high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None}


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
        txn_config: the transaction coordinator's settings.
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
                 purgatory: Purgatory | None = None, txn_config: TxnConfig = TxnConfig()) -> None:
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
        self.producer_ids = ProducerIds(store.root)
        self._groups_lock = threading.Lock()
        self.group_config = group_config
        #: acks=all answers after an fsync of the partitions written (else once in the log)
        self.fsync_acks_all = fsync_acks_all
        self._groups: GroupCoordinator | None = None
        self.txn_config = txn_config
        self._txn: TransactionCoordinator | None = None
        #: api key -> (lowest, highest) version served (what ApiVersions advertises)
        self.supported: dict[int, tuple[int, int]] = dict(SUPPORTED)
        #: the APIs answered on the network loop (they never block), not on a worker
        self.inline: frozenset[int] = frozenset({18})
        self.handlers: dict[int, Callable[[KafkaRequest], Any]] = {
            0: self.on_produce, 1: self.on_fetch, 2: self.on_list_offsets, 3: self.on_metadata,
            18: self.on_api_versions, 19: self.on_create_topics, 20: self.on_delete_topics,
            22: self.on_init_producer_id, 8: self.on_offset_commit, 9: self.on_offset_fetch,
            10: self.on_find_coordinator, 11: self.on_join_group, 12: self.on_heartbeat, 13: self.on_leave_group,
            14: self.on_sync_group, 15: self.on_describe_groups, 16: self.on_list_groups,
            32: self.on_describe_configs, 17: self.on_sasl_handshake, 36: self.on_sasl_authenticate,
            24: self.on_add_partitions_to_txn, 25: self.on_add_offsets_to_txn, 26: self.on_end_txn,
            28: self.on_txn_offset_commit, 61: self.on_describe_producers, 65: self.on_describe_transactions,
            66: self.on_list_transactions,
        }

    def close(self) -> None:
        """Answer the fetches, joins and syncs still waiting (the server is stopping)."""
        self._appends.close()
        if self._groups is not None:
            self._groups.close()
        if self._owns_purgatory:
            self.purgatory.close()

    @property
    def groups(self) -> GroupCoordinator:
        """The group coordinator (``__consumer_offsets`` is created on first use)."""
        if self._groups is None:
            with self._groups_lock:
                if self._groups is None:
                    self._groups = GroupCoordinator(offset_store(self.store), self.purgatory, self._partition_exists,
                                                    self.group_config)
        return self._groups

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
        return {"error_code": ErrorCode.none, "api_keys": api_version_ranges(self.supported), "throttle_time": 0}

    # ------------------------------------------------------------------ Metadata
    def on_metadata(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        requested = None if body.topics is None else [t.name for t in body.topics]
        if request.api_version == 0 and requested == []:
            requested = None  # v0: an empty list means every topic
        allow_create = self.auto_create_topics and getattr(body, "allow_auto_topic_creation", True)
        names = self.store.topics() if requested is None else requested
        topics = [self._topic_metadata(name, allow_create and requested is not None) for name in names]
        return {
            "throttle_time": 0,
            "brokers": [{"node_id": self.node_id, "host": self.host, "port": self.port, "rack": None}],
            "cluster_id": self.cluster_id,
            "controller_id": self.node_id,
            "topics": topics,
            "cluster_authorized_operations": -2147483648,
        }

    def _topic_metadata(self, name: str, create: bool) -> dict[str, Any]:
        try:
            count = self.store.partitions_for(name)
        except UnknownTopicOrPartitionError:
            count = 0
        except InvalidTopicError:
            return _topic_refused(name, ErrorCode.invalid_topic_exception)
        if count == 0 and create:
            try:
                self.store.create_topic(name, self.num_partitions, exist_ok=True)
                count = self.store.partitions_for(name)
                logger.info("created topic %s (%d partitions) for a metadata request", name, count)
            except InvalidTopicError:
                return _topic_refused(name, ErrorCode.invalid_topic_exception)
        if count == 0:
            return _topic_refused(name, ErrorCode.unknown_topic_or_partition)
        me = [self.node_id]
        return {
            "error_code": ErrorCode.none, "name": name, "is_internal": name.startswith("__"),
            "partitions": [{"error_code": ErrorCode.none, "partition_index": p, "leader_id": self.node_id,
                            "leader_epoch": 0, "replica_nodes": me, "isr_nodes": me, "offline_replicas": []}
                           for p in range(count)],
            "topic_authorized_operations": -2147483648,
        }

    # ------------------------------------------------------------------ Produce
    def on_produce(self, request: KafkaRequest) -> dict[str, Any] | None:
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
        partition of the producer's ongoing transaction."""
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
            first, _, duplicate = log.append_idempotent(records)
        except (CorruptRecordError, RecordTooLargeError, OutOfOrderSequenceError, InvalidProducerEpochError,
                InvalidRecordError) as exc:  # InvalidRecordError: e.g. a keyless record in a compacted topic
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
    def on_fetch(self, request: KafkaRequest) -> dict[str, Any] | Future:
        body = request.body
        max_wait_ms = int(body.max_wait.total_seconds() * 1000)
        wanted = [(t.topic, p.partition, p.fetch_offset, p.partition_max_bytes)
                  for t in body.topics for p in t.partitions]

        read_committed = body.isolation_level == 1

        def attempt(expired: bool) -> dict[str, Any] | None:
            answer, size = self._fetch(wanted, body.max_bytes, read_committed)
            if expired or size >= body.min_bytes or size < 0:
                return answer
            _release(answer)
            return None

        counter = self.store.notification()  # appends from here on wake the wait below
        answer, size = self._fetch(wanted, body.max_bytes, read_committed)
        if size >= body.min_bytes or size < 0 or max_wait_ms <= 0 or not wanted:
            return answer
        _release(answer)
        keys = {(topic, partition) for topic, partition, _, _ in wanted}
        if len(keys) == 1:
            waiting = self.purgatory.watch(next(iter(keys)), attempt, max_wait_ms / 1000.0)
        else:  # several partitions: one wait, checked by an append to any of them
            waiting = _watch_any(self.purgatory, keys, attempt, max_wait_ms / 1000.0)
        self._appends.watch(counter, keys)
        return waiting

    def _fetch(self, wanted: list[tuple[str, int, int, int]], max_bytes: int,
               read_committed: bool = False) -> tuple[dict[str, Any], int]:
        """The answer to a fetch now, and the record bytes in it (-1: an error to report now).

        As Kafka's: a partition in error has no offsets (-1); read_committed reads stop at the
        last stable offset and list the aborted transactions that overlap the records returned
        (from the segments' ``.txnindex``), read_uncommitted reads stop at the high watermark
        and have null for that list."""
        topics: dict[str, list[dict[str, Any]]] = {}
        total = 0
        errors = False
        for topic, partition, offset, partition_max in wanted:
            entry = {"partition_index": partition, "error_code": ErrorCode.none, "high_watermark": -1,
                     "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
                     "preferred_read_replica": -1, "records": b""}
            topics.setdefault(topic, []).append(entry)
            refused = self.partition_error(topic, partition)
            if refused:
                entry["error_code"] = refused
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
            # limits; the others get whole batches within theirs, or none.
            limit = min(partition_max, max_bytes - total) if total else partition_max
            if limit <= 0:
                continue
            try:
                data = log.read_region(offset, max(limit, 1), max_offset=visible,  # written with sendfile
                                       end_offset=read_committed)
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
                  "responses": [{"topic": t, "partitions": parts} for t, parts in topics.items()]}
        return answer, (-1 if errors else total)

    # ------------------------------------------------------------------ ListOffsets
    def on_list_offsets(self, request: KafkaRequest) -> dict[str, Any]:
        topics = []
        read_committed = getattr(request.body, "isolation_level", 0) == 1
        for topic in request.body.topics:
            partitions = []
            for p in topic.partitions:
                entry = {"partition_index": p.partition_index, "error_code": ErrorCode.none, "timestamp": -1,
                         "offset": -1, "leader_epoch": 0}
                refused = self.partition_error(topic.name, p.partition_index)
                try:
                    if refused:
                        raise UnknownTopicOrPartitionError(f"{topic.name}-{p.partition_index}")
                    log = self.store.partition(topic.name, p.partition_index)
                except (UnknownTopicOrPartitionError, InvalidTopicError):
                    entry["error_code"] = refused or ErrorCode.unknown_topic_or_partition
                else:
                    ts = int(p.timestamp.timestamp() * 1000) if hasattr(p.timestamp, "timestamp") else int(p.timestamp)
                    # Kafka's lastFetchableOffset: read_committed (v2+) sees up to the LSO
                    visible = log.last_stable_offset if read_committed else log.high_watermark
                    if ts == -1:
                        entry["offset"] = visible
                    elif ts == -2:
                        entry["offset"] = log.log_start_offset
                    else:
                        found = log.offset_for_timestamp(ts)
                        if found is not None and found >= visible:
                            found = None  # not committed (or stable) yet: not to be seen
                        if found is not None:
                            # Kafka answers with the found record's own timestamp, not the one asked.
                            try:
                                record = log.read(found, max_records=1)
                            except OffsetOutOfRangeError:  # deleted by retention meanwhile
                                record = []
                            except CorruptRecordError as exc:  # a fetch from there reports it
                                logger.error("list offsets of %s-%d at %d: %s", topic.name, p.partition_index,
                                             found, exc)
                                record = []
                            entry["offset"], entry["timestamp"] = found, record[0].timestamp if record else ts
                partitions.append(entry)
            topics.append({"name": topic.name, "partitions": partitions})
        return {"throttle_time": 0, "topics": topics}

    # ------------------------------------------------------------------ topics
    def on_create_topics(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        results = []
        for topic in body.topics:
            partitions = topic.num_partitions if topic.num_partitions != -1 else self.num_partitions
            configs = {c.name: c.value for c in topic.configs}
            # Kafka's checks in its order (ReplicationControlManager.createTopics), validate_only too
            error, message = self._check_new_topic(topic.name, configs)
            if error == ErrorCode.none and (topic.replication_factor not in (-1, 1) or topic.assignments):
                error = ErrorCode.invalid_replication_factor
                message = "this broker has one replica of each partition"
            if error == ErrorCode.none and partitions <= 0:
                error, message = ErrorCode.invalid_partitions, f"{partitions} partitions"
            if error == ErrorCode.none and not body.validate_only:
                error, message = self._create(topic.name, partitions, configs)
            results.append({"name": topic.name, "error_code": error, "error_message": message})
        return {"throttle_time": 0, "topics": results}

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
        if name.startswith("__"):  # as LogStore.create_topic
            return (ErrorCode.invalid_topic_exception,
                    f"topic names starting with '__' are reserved for internal topics: {name!r}")
        nulls = sorted(k for k, v in configs.items() if v is None)
        unknown = sorted(k for k in configs if k in kafkaconfigs.NOT_TOPIC_CONFIGS)
        if nulls:
            return ErrorCode.invalid_config, f"null value not supported for topic configs: {', '.join(nulls)}"
        if unknown:
            return ErrorCode.invalid_config, f"unknown topic config name: {', '.join(unknown)}"
        try:
            LogConfig.from_kafka({**self.store.defaults.to_kafka(), **configs})
        except (InvalidConfigError, TypeError, ValueError) as exc:
            return ErrorCode.invalid_config, str(exc)
        return ErrorCode.none, None

    def _create(self, name: str, partitions: int, configs: dict[str, str | None]) -> tuple[int, str | None]:
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
        for name in request.body.topic_names:
            try:
                self.store.delete_topic(name)
                error = ErrorCode.none
            except (UnknownTopicOrPartitionError, InvalidTopicError):
                error = ErrorCode.unknown_topic_or_partition
            results.append({"name": name, "error_code": error})
        return {"throttle_time": 0, "responses": results}

    def on_sasl_handshake(self, request: KafkaRequest) -> dict[str, Any]:
        """SASL is answered before authentication (:mod:`~logstore.kafka.auth`); here, after it or
        on a listener without SASL, it is Kafka's ILLEGAL_SASL_STATE."""
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}

    def on_sasl_authenticate(self, request: KafkaRequest) -> dict[str, Any]:
        """As :meth:`on_sasl_handshake` (no re-authentication: sessions do not expire)."""
        return {"error_code": ErrorCode.illegal_sasl_state, "auth_bytes": b"", "session_lifetime": 0,
                "error_message": "SaslAuthenticate after authentication, or on a listener without SASL"}

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
        wanted = [(t.name, p.partition_index, p.committed_offset, p.committed_metadata or "")
                  for t in body.topics for p in t.partitions]
        error = self.verify_partition(body.transactional_id, body.producer_id, body.producer_epoch, (OFFSETS_TOPIC, 0))
        if error == ErrorCode.transaction_abortable:
            error = ErrorCode.invalid_txn_state  # AddOffsetsToTxn did not come first
        error = self._txn_error(error, request.api_version, 3)
        if error == ErrorCode.none and getattr(body, "generation_id", -1) >= 0:
            error = self.groups.check_transactional_commit(body.group_id, body.generation_id, body.member_id,
                                                           getattr(body, "group_instance_id", None))
        errors: dict[tuple[str, int], int] = {}
        if error == ErrorCode.none:
            for topic, partition, _, _ in wanted:
                if not self._partition_exists(topic, partition):
                    errors[(topic, partition)] = ErrorCode.unknown_topic_or_partition
            good = {(t, p): (o, m) for t, p, o, m in wanted if (t, p) not in errors}
            try:
                self.groups.offsets.commit_transactional(body.group_id, good, body.producer_id, body.producer_epoch)
            except (LogstoreError, OSError) as exc:
                logger.error("TxnOffsetCommit of %s for %s failed: %s", body.transactional_id, body.group_id, exc)
                error = ErrorCode.unknown_server_error if isinstance(exc, LogstoreError) else ErrorCode.kafka_storage_error
        topics: dict[str, list[dict[str, Any]]] = {}
        for topic, partition, _, _ in wanted:
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
                                                                       body.include_synonyms)
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
                "log.dirs": self.store.root}

    # ------------------------------------------------------------------ consumer groups
    def on_find_coordinator(self, request: KafkaRequest) -> dict[str, Any]:
        key_type = getattr(request.body, "key_type", 0)
        if key_type not in (0, 1):  # 0: a group, 1: a transactional id (this broker coordinates both)
            return {"throttle_time": 0, "error_code": ErrorCode.invalid_request, "node_id": -1, "host": "",
                    "port": -1, "error_message": f"unknown coordinator key type {key_type}"}
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "node_id": self.node_id,
                "host": self.host, "port": self.port}

    def on_join_group(self, request: KafkaRequest) -> dict[str, Any] | Future:
        body = request.body
        session_ms = _ms(body.session_timeout)
        rebalance_ms = _ms(body.rebalance_timeout) if request.api_version >= 1 else session_ms
        return self.groups.join(body.group_id, body.member_id, getattr(body, "group_instance_id", None),
                                request.client_id or "", request.client_host, session_ms, rebalance_ms,
                                body.protocol_type,
                                [(p.name, p.metadata) for p in body.protocols], request.api_version >= 4)

    def on_sync_group(self, request: KafkaRequest) -> dict[str, Any] | Future:
        body = request.body
        return self.groups.sync(body.group_id, body.generation_id, body.member_id,
                                getattr(body, "group_instance_id", None),
                                {a.member_id: a.assignment for a in body.assignments})

    def on_heartbeat(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        error = self.groups.heartbeat(body.group_id, body.generation_id, body.member_id,
                                      getattr(body, "group_instance_id", None))
        return {"throttle_time": 0, "error_code": error}

    def on_leave_group(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        if request.api_version < 3:
            (error,) = self.groups.leave(body.group_id, [(body.member_id, None)])
            return {"throttle_time": 0, "error_code": error}
        members = [(m.member_id, m.group_instance_id) for m in body.members]
        errors = self.groups.leave(body.group_id, members)
        return {"throttle_time": 0, "error_code": ErrorCode.none,
                "members": [{"member_id": member_id, "group_instance_id": instance_id, "error_code": error}
                            for (member_id, instance_id), error in zip(members, errors)]}

    def on_offset_commit(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        items = [(t.name, p.partition_index, p.committed_offset, p.committed_metadata)
                 for t in body.topics for p in t.partitions]
        errors = self.groups.commit_offsets(body.group_id, body.generation_id_or_member_epoch, body.member_id,
                                            getattr(body, "group_instance_id", None), items)
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition, _, _), error in zip(items, errors):
            topics.setdefault(topic, []).append({"partition_index": partition, "error_code": error})
        return {"throttle_time": 0, "topics": [{"name": t, "partitions": parts} for t, parts in topics.items()]}

    def on_offset_fetch(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body
        wanted = None if body.topics is None else [(t.name, p) for t in body.topics for p in t.partition_indexes]
        if not body.group_id:
            return {"throttle_time": 0, "topics": [], "error_code": ErrorCode.invalid_group_id}
        topics: dict[str, list[dict[str, Any]]] = {}
        for topic, partition, offset, metadata in self.groups.fetch_offsets(body.group_id, wanted):
            topics.setdefault(topic, []).append({"partition_index": partition, "committed_offset": offset,
                                                 "committed_leader_epoch": -1, "metadata": metadata,
                                                 "error_code": ErrorCode.none})
        return {"throttle_time": 0, "error_code": ErrorCode.none,
                "topics": [{"name": t, "partitions": parts} for t, parts in topics.items()]}

    def on_describe_groups(self, request: KafkaRequest) -> dict[str, Any]:
        groups = []
        for group_id in request.body.groups:
            found = self.groups.describe(group_id)
            if found is None:  # Kafka describes an unknown group as a dead one
                found = {"state": "Dead", "protocol_type": "", "protocol": "", "members": []}
            groups.append({"error_code": ErrorCode.none, "group_id": group_id, "group_state": found["state"],
                           "protocol_type": found["protocol_type"], "protocol_data": found["protocol"],
                           "members": [{"member_id": m["member_id"], "group_instance_id": m["group_instance_id"],
                                        "client_id": m["client_id"], "client_host": m["client_host"],
                                        "member_metadata": m["metadata"], "member_assignment": m["assignment"]}
                                       for m in found["members"]],
                           "authorized_operations": -2147483648})
        return {"throttle_time": 0, "groups": groups}

    def on_list_groups(self, request: KafkaRequest) -> dict[str, Any]:
        return {"throttle_time": 0, "error_code": ErrorCode.none,
                "groups": [{"group_id": g, "protocol_type": t} for g, t, _ in self.groups.groups()]}


#: what a transactional produce's verification may answer while the coordinator is busy or
#: moving: the batch is refused with NOT_ENOUGH_REPLICAS, which producers retry (Kafka's
#: ReplicaManager maps them so)
_VERIFY_RETRIABLE = frozenset({ErrorCode.concurrent_transactions, ErrorCode.coordinator_load_in_progress,
                               ErrorCode.coordinator_not_available, ErrorCode.not_coordinator})


def _topic_refused(name: str, error: ErrorCode) -> dict[str, Any]:
    """Metadata's answer for a topic it cannot describe."""
    return {"error_code": error, "name": name, "is_internal": False, "partitions": []}


def _ms(value: Any) -> int:
    """Milliseconds of a kio duration (a timedelta) or an int."""
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


def api_version_ranges(supported: Mapping[int, tuple[int, int]] = SUPPORTED) -> list[dict[str, int]]:
    """ApiVersions' list: every API served and its version range."""
    return [{"api_key": key, "min_version": low, "max_version": high}
            for key, (low, high) in sorted(supported.items())]


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
