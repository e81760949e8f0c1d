"""A replica node's Kafka listener: Kafka clients talk to a replica set as to a Kafka cluster.

:class:`ReplicaKafkaApis` is :class:`~logstore.kafka.apis.KafkaApis` over a
:class:`~logstore.replication.ReplicaNode`'s store, answering for its replicated partitions as a
broker of a Kafka cluster does:

- **Metadata** names every node's Kafka listener (``kafka_brokers``: this node's and its peers')
  and, per partition, the elected leader and its epoch, the replicas (the voters) and the
  in-sync replicas (the leader's view; a follower names the voters). A partition without a
  leader, or whose leader's listener is unknown, is LEADER_NOT_AVAILABLE.
- **Produce** goes to the leader; any other node answers NOT_LEADER_OR_FOLLOWER, and clients
  refresh their metadata and follow. The batch is appended by the leader's idempotent path
  (duplicates of an idempotent producer's retries are recognised, by the producer state that
  followers rebuild from the batches they copy, so also after a failover); acks=1 is answered
  once the leader holds it, acks=all (-1) once the high watermark (the majority's end) passed
  it, with NOT_ENOUGH_REPLICAS when fewer than ``min_insync_replicas`` are in sync, and
  REQUEST_TIMED_OUT when the request's timeout runs out first. A duplicate is answered as its
  first append would be: with acks=all, once it is committed.
- **Fetch** and **ListOffsets** go to the leader too, and stop at the high watermark: a
  consumer sees committed records only. With tiered storage (the node's ``remote_storage``)
  a fetch below the local segments reads the remote tier, as the single store's listener
  does; ``__remote_log_metadata`` takes produces from the replica user alone (the nodes'
  metadata managers' writes, :mod:`~logstore.replica.tiering`), as every internal topic
  refuses clients'.
- Topics are the node's replicated partitions: DeleteTopics is refused (POLICY_VIOLATION with
  a message: a topic's id is derived from its name). **CreateTopics**, **CreatePartitions**,
  **AlterConfigs** and **IncrementalAlterConfigs** of topics are made by the leader of ``__cluster_metadata-0``
  (:mod:`~logstore.replica.metadata`): another node forwards them there in an Envelope, as it
  forwards the ACLs' changes (below: the leader authorizes), and answers what it answered
  (NOT_CONTROLLER while there is none); every node applies the committed change to its
  store, new topics' partitions becoming replicated partitions (every voter a replica);
  broker configs are refused
  (POLICY_VIOLATION). DeleteRecords goes to the leader, which moves its log start and answers once every
  follower moved its own (the followers learn it from their fetches' answers and report theirs
  in their fetches, as Kafka's; every voter, since any may win the next election); DescribeLogDirs describes every partition this node holds.
- SASL users are each node's own (the credentials file and the replica user): AlterUserScramCredentials
  is refused (POLICY_VIOLATION), DescribeUserScramCredentials describes the node's.
- **InitProducerId** hands out ids unique across the replica set (``id * (max voter + 1) +
  node id``), so producers that start on different nodes never share an id.

**Transactions** are coordinated by the leader of ``__transaction_state`` partition 0
(:mod:`~logstore.replica.transactions`): FindCoordinator for a transactional id names it,
InitProducerId with a transactional id, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and
DescribeTransactions are answered there (NOT_COORDINATOR elsewhere, COORDINATOR_LOAD_IN_PROGRESS
while it takes the state up), ListTransactions anywhere (empty off the coordinator). The
markers go to each partition's leader (WriteTxnMarkers between nodes) and count once a majority
holds them. TxnOffsetCommit goes to the group coordinator, which asks the transaction
coordinator (AddPartitionsToTxn v4, ``verify_only``) as the partition leaders do for a batch that
opens a producer's transaction in a partition (KIP-890). Fetch read_committed stops at the last
stable offset, which never passes the high watermark.

**ACLs** (with an authorizer, ``authorizer=True`` in the node's ``kafka_options``) are
replicated in ``__acls`` (:mod:`~logstore.replica.acls`) and enforced by every node with the
table of :mod:`~logstore.kafka.aclguard`; the replica user is a super user (the peers'
requests). CreateAcls and DeleteAcls are made by the leader of ``__acls-0``: another node
forwards them there in an Envelope (KIP-590's idea: the client's request as it came, with its
principal and address), and the leader authorizes that principal against its own ACLs, the
newest committed, where the change is applied: a follower's copy may lag, and a principal whose
ALTER was just revoked must not alter the ACLs through it. The follower answers what the leader
answered; DescribeAcls answers from the node's committed copy. The Envelope is the peers' only
(the replica user's; any other principal gets CLUSTER_AUTHORIZATION_FAILED); its principal is
the text ``User:<name>`` in UTF-8 (null: anonymous), its client address the IP's bytes, as
Kafka's; it carries only CreateAcls, DeleteAcls and the topic changes above (another request:
INVALID_REQUEST).

**Consumer groups** are coordinated by the leader of ``__consumer_offsets`` partition 0, which
the set replicates like any partition (Kafka's rule: a group's coordinator leads the offsets
partition its id hashes to; here there is one). FindCoordinator names that leader (or answers
COORDINATOR_NOT_AVAILABLE while there is none), and the other nodes answer the group requests
with NOT_COORDINATOR, so clients find it again after a failover. The coordinator is
:class:`~logstore.groups.coordinator.GroupCoordinator` over an OffsetStore whose writes are appended
by the leader and return once the high watermark passed them: a commit that was answered
survives the loss of any minority. A node that becomes the leader takes the groups up from the
replicated log (membership included) in a new coordinator, and one that loses the leadership
drops its own.

Thread-safety: as KafkaApis. Appends take the partition's lock inside the node's purgatory's
deferred block, as a follower's fetch does; fetch attempts, which run inside partition changes,
take no partition lock.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import threading
import uuid
import time
from concurrent.futures import Future
from typing import Any, Iterable

from .quorum import NONE as NO_LEADER, Role
from .._native import lib
from ..errorcodes import ErrorCode, code_for
from ..errors import (
    CorruptRecordError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTopicError,
    LogstoreError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    RequestTimedOutError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
    UnsupportedCodecError,
)
from ..kafka.acls import Authorizer
from ..kafka.apikeys import CREATE_ACLS, DELETE_ACLS, ENVELOPE, FETCH, PRODUCE
from ..kafka.client import KafkaClientError, read_response
from ..kafka.writer import write_request
from ..kafka.admin import refused
from ..kafka.configs import TOPIC
from ..kafka.apis import KafkaApis, delete_topics_asked, internal_topic_refusal, one_v2_batch_problem
from ..store.topicids import ZERO_TOPIC_ID
from ..store.kafkadirs import is_internal_topic
from ..groups.coordinator import GroupCoordinator
from ..kafka.wire import (KafkaProtocolError, KafkaRequest, UnsupportedVersionError, encode, fetch_replica_id,
                          parse_request)
from ..groups.offsets import OFFSETS_TOPIC, OffsetStore
from ..txn.coordinator import TransactionCoordinator
from ..txn.metadata import TRANSACTION_STATE_TOPIC
from ..txn.producerids import ProducerIds
from ..records.batch import validate_client_batch
from .acls import ReplicatedAcls
from .client import REPLICA_USER
from .context import NodeContext
from .leader import LeaderSide
from .metadata import METADATA_TOPIC, ReplicaAdminApis, ReplicatedMetadata
from .partition import PartitionReplica
from .peerapis import PEER_VERSIONS, PeerApis
from .replicatedlog import WRITE_TIMEOUT_S, ReplicatedLog
from .tiering import REMOTE_LOG_METADATA_TOPIC
from .transactions import ReplicaMarkers, TxnCoordinatorSlot, TxnVerifier

__all__ = ["ReplicaKafkaApis"]

logger = logging.getLogger("logstore.replication.kafka")

OFFSETS_KEY = (OFFSETS_TOPIC, 0)
#: how long a group write waits for the majority (then the request fails; the client retries)
GROUP_WRITE_TIMEOUT_S = 10.0
#: how long a forwarded topic change waits for the metadata's leader (which waits up to
#: WRITE_TIMEOUT_S for its majority)
_FORWARD_TIMEOUT_S = WRITE_TIMEOUT_S + 5.0


class ReplicaKafkaApis(KafkaApis):
    """KafkaApis answering for a replica node's partitions (see the module docstring).

    Args:
        context: the node's identity, settings and partitions.
        leader: the node's leader side (in-sync replicas, the high watermark, acks=all).
        peer_apis: the answers to the peers' requests, served on the same listener.
        kafka_brokers: ``{node id: (host, port)}``: every node's advertised Kafka listener.
        metadata: the set's replicated topic metadata (CreatePartitions, topic configs).
        **kwargs: KafkaApis' arguments (the store is the node's; the purgatory is the node's,
            so that its partitions' changes wake held fetches and acks=all produces).
    """

    def __init__(self, context: NodeContext, leader: LeaderSide, peer_apis: PeerApis,
                 kafka_brokers: dict[int, tuple[str, int]], metadata: ReplicatedMetadata, *args: Any,
                 **kwargs: Any) -> None:
        kwargs["purgatory"] = context.purgatory
        kwargs["auto_create_topics"] = False
        super().__init__(*args, **kwargs)
        self.context = context
        self.leader = leader
        self.kafka_brokers = kafka_brokers
        self._stride = max(context.voters) + 1
        # A node's producer ids (times the stride, plus its id) start, in a store that has none
        # yet, at the clock's microseconds: after a restart with an empty disk the node never
        # hands out an id it gave before (the other nodes keep those producers' sequences).
        # (Below 2**63 / stride: int64 ids for any set of up to ~5,000 node ids.)
        ceiling = (2**63 - 1) // self._stride // 2
        self.producer_ids = ProducerIds(self.store.root, first_at_least=lambda: min(time.time_ns() // 1000, ceiling))
        self.cluster_id = context.cluster_id  # one for every node of the set
        self._groups_epoch = -1
        #: the set's replicated ACLs, once an authorizer is made (:meth:`new_authorizer`)
        self.acls: ReplicatedAcls | None = None
        for key, refusal in _GROUP_REFUSALS.items():
            if key in self.handlers:  # (68 and 69 only with the consumer group protocol)
                self.handlers[key] = self._coordinated(self.handlers[key], refusal)
        # The peers' requests, on the same listener.
        self.peer_apis = peer_apis
        self.supported = {**self.supported, **PEER_VERSIONS}
        self.handlers.update({27: self.peer_apis.on_write_txn_markers, 52: self.peer_apis.on_vote,
                              53: self.peer_apis.on_begin_quorum_epoch, 55: self.peer_apis.on_describe_quorum,
                              ENVELOPE: self.on_envelope})
        self.supported[ENVELOPE] = (0, 0)
        #: the changes made only by a replicated topic's leader (the ACLs' and the metadata's),
        #: as they came in an Envelope: authorized here, made here, never forwarded again
        self._enveloped: dict[int, Any] = {}
        # Transactions: the leader of __transaction_state-0 coordinates (see the module docstring).
        self.markers = ReplicaMarkers(context, leader)
        self.slot = TxnCoordinatorSlot(context, leader, self.markers, self._new_producer_id, self.txn_config)
        self.verifier = TxnVerifier(context, self.slot)
        self.supported[24] = (0, 4)  # v4: the partition leaders' verify_only (KIP-890), peers only
        for key, refusal in _TXN_REFUSALS.items():
            self.handlers[key] = self._txn_coordinated(self.handlers[key], refusal)
        self.slot.start()
        # DeleteRecords by the leader, answered once every follower moved its log start; topic
        # changes by the metadata's leader, forwarded there
        self.metadata = metadata
        self.admin = ReplicaAdminApis(self, metadata, move_log_start=self._move_log_start)
        # (made here; guard_handlers puts each behind its rule, then forwards it while another
        # node leads the metadata)
        self.handlers.update({21: self.admin.on_delete_records, 35: self.admin.on_describe_log_dirs,
                              33: self.admin.on_alter_configs, 37: self.admin.on_create_partitions,
                              44: self.admin.on_incremental_alter_configs})
        # A fetch never blocks (a caught-up one waits in the purgatory; the store's flush
        # policy fsyncs outside the log's lock): answered on the network loop, no thread
        # hand-off per follower fetch. A produce goes to a worker: it appends through the
        # replica set's leader (on_produce), not the single store's try path.
        self.inline = (self.inline | {FETCH}) - {PRODUCE}
        # Its fetches read as before, without holding the logs: a partition's leadership is
        # looked up under the replica's locks, which an append holds while it takes the log.
        self.fetch_holds_logs = False

    def close(self) -> None:
        """Close the transaction coordinator (its marker thread joined), its marker senders and
        verification connections, then answer what waits (KafkaApis.close)."""
        self.slot.close()
        self.markers.close()
        self.verifier.close()
        super().close()

    # ------------------------------------------------------------------ ACLs
    def new_authorizer(self, super_users: Iterable[str] = (), allow_everyone_if_no_acl_found: bool = False
                       ) -> Authorizer:
        """The authorizer over the set's replicated ACLs; the replica user is a super user."""
        self.acls = ReplicatedAcls(self.context, self.leader)
        return Authorizer(self.acls, [*super_users, f"User:{REPLICA_USER}"], allow_everyone_if_no_acl_found)

    def guard_handlers(self, authorizer: Authorizer | None) -> None:
        """KafkaApis' guard; then the changes that a replicated topic's leader makes (CreateAcls
        and DeleteAcls: ``__acls-0``'s; CreateTopics, CreatePartitions, AlterConfigs and
        IncrementalAlterConfigs: ``__cluster_metadata-0``'s) are made here while this node
        leads it, else forwarded unauthorized in an Envelope (the leader authorizes, with its
        own ACLs), and the Envelopes' go to the guarded handlers (made here whoever leads by
        now: never forwarded twice)."""
        super().guard_handlers(authorizer)
        here = {key: self.handlers[key] for key in (CREATE_ACLS, DELETE_ACLS, *_METADATA_CHANGES)}
        self._enveloped = here
        self.handlers[CREATE_ACLS] = lambda request: self._acl_change(request, here[CREATE_ACLS], "results")
        self.handlers[DELETE_ACLS] = lambda request: self._acl_change(request, here[DELETE_ACLS], "filter_results")
        for key in _METADATA_CHANGES:
            self.handlers[key] = self._metadata_change(here[key])

    def _acl_change(self, request: KafkaRequest, here: Any, results: str) -> dict[str, Any]:
        """A change of the ACLs: authorized and made here when this node leads ``__acls-0``
        (or there is no authorizer: SECURITY_DISABLED), else forwarded to the node that does,
        in an Envelope that names the client's principal: the leader authorizes it."""
        acls = self.acls
        if self.authorizer is None or acls is None or acls.leading():
            return here(request)  # type: ignore[no-any-return]
        leader = acls.leader_id()
        listed = request.body.creations if results == "results" else request.body.filters
        if leader not in self.context.peers:
            return _refuse_acl_change(results, listed, ErrorCode.not_controller, "no leader of the ACLs yet")
        try:
            return self._forward_enveloped(request, leader)
        except (OSError, LogstoreError) as exc:
            logger.warning("forwarding %s to node %d failed: %s", request.name, leader, exc)
            return _refuse_acl_change(results, listed, ErrorCode.not_controller,
                                      f"node {leader}, the ACLs' leader, did not answer: {exc}")

    def _metadata_change(self, here: Any) -> Any:
        """A handler of a topic change: made here when this node leads
        ``__cluster_metadata-0``, or when it changes no topic (a broker's or a group's configs,
        refused here by policy whoever leads), else forwarded to the node that does in an
        Envelope naming the client's principal (the leader authorizes it), whose answer is this
        one."""
        def answer(request: KafkaRequest) -> dict[str, Any]:
            metadata = self.metadata
            if metadata.leading() or not _changes_topics(request):
                return here(request)  # type: ignore[no-any-return]
            leader = metadata.leader_id()
            if leader not in self.context.peers:
                return refused(request, f"no leader of {METADATA_TOPIC} yet", ErrorCode.not_controller)
            try:
                return self._forward_enveloped(request, leader, _FORWARD_TIMEOUT_S)
            except (OSError, LogstoreError) as exc:
                logger.warning("forwarding %s to node %d failed: %s", request.name, leader, exc)
                return refused(request, f"node {leader}, the metadata's leader, did not answer: {exc}",
                               ErrorCode.not_controller)
        return answer

    def _forward_enveloped(self, request: KafkaRequest, leader: int,
                           timeout_s: float = GROUP_WRITE_TIMEOUT_S) -> dict[str, Any]:
        """``request`` as the client sent it, with its principal and address, in an Envelope to
        peer ``leader``; returns the answer the leader made.

        Raises:
            OSError, LogstoreError: the peer did not answer, or refused the Envelope.
        """
        inner = write_request(request.correlation_id, type(request.body), request.client_id,
                              dataclasses.asdict(request.body))
        envelope = {"request_data": bytes(inner[4:]),  # (after the size)
                    "request_principal": None if request.principal is None else str(request.principal).encode(),
                    "client_host_address": _host_bytes(request.client_host)}
        answer = self.context.forward_connections.request(leader, ENVELOPE, envelope, timeout_s)
        if answer.error_code != ErrorCode.none or answer.response_data is None:
            raise KafkaClientError(f"Envelope answered {ErrorCode(answer.error_code).name}")
        body = read_response(request.api_key, request.api_version, memoryview(answer.response_data),
                             request.correlation_id, f"the {request.name} node {leader} answered")
        return dataclasses.asdict(body)  # type: ignore[no-any-return]

    def on_envelope(self, request: KafkaRequest) -> dict[str, Any]:
        """A peer's forwarded change (see the module docstring): authorized here, for the
        principal and address it names, and made here."""
        if request.principal != f"User:{REPLICA_USER}":
            return {"response_data": None, "error_code": ErrorCode.cluster_authorization_failed}
        body = request.body
        try:
            inner = parse_request(bytes(body.request_data), {key: self.supported[key] for key in self._enveloped})
            principal = None if body.request_principal is None else bytes(body.request_principal).decode("utf-8")
            host = _host_text(bytes(body.client_host_address))
        except (KafkaProtocolError, UnsupportedVersionError, UnicodeDecodeError, ValueError) as exc:
            logger.warning("refusing an Envelope: %s", exc)
            return {"response_data": None, "error_code": ErrorCode.invalid_request}
        inner.principal, inner.client_host = principal, host
        answer = self._enveloped[inner.api_key](inner)
        frame = b"".join(bytes(b) for b in encode(inner.correlation_id, inner.api_key, inner.api_version, answer))
        return {"response_data": frame[4:], "error_code": ErrorCode.none}

    def on_fetch(self, request: KafkaRequest) -> dict[str, Any] | Future:
        if fetch_replica_id(request) >= 0:  # a follower's
            return self.peer_apis.on_replica_fetch(request)
        return super().on_fetch(request)

    # ------------------------------------------------------------------ groups
    def _coordinator(self) -> tuple[int, int]:
        """(leader, epoch) of the offsets partition; leader -1 when none is known."""
        rep = self._replica(*OFFSETS_KEY)
        if rep is None:
            return -1, -1
        election = rep.election
        return (election.leader if election.leader != NO_LEADER else -1), election.epoch

    def _coordinated(self, handler: Any, refusal: Any) -> Any:
        def answer(request: KafkaRequest) -> Any:
            leader, _ = self._coordinator()
            if leader != self.node_id:
                self._drop_groups()
                return refusal(request)
            return handler(request)
        return answer

    def _drop_groups(self) -> None:
        """No longer the coordinator: the joins and syncs waiting here are answered (the members
        look for the coordinator again) and the groups are forgotten."""
        with self._groups_lock:
            old, self._groups = self._groups, None
            consumer, self._consumer_groups = self._consumer_groups, None
            self._groups_epoch = -1
        if old is not None:
            old.close()
        if consumer is not None:
            consumer.close()

    @property
    def groups(self) -> GroupCoordinator:
        """This node's group coordinator while it leads the offsets partition: a new one for
        each of its epochs (the groups taken up from the replicated log)."""
        rep = self._replica(*OFFSETS_KEY)
        with self._groups_lock:
            epoch = rep.election.epoch
            if rep.election.role is not Role.LEADER:  # lost between the check and here
                raise LogstoreError(f"node {self.node_id} does not lead {OFFSETS_TOPIC}-0")
            if self._groups is None or self._groups_epoch != epoch:
                old, self._groups = self._groups, None
                if old is not None:
                    old.close()
                if self._consumer_groups is not None:
                    self._consumer_groups.close()
                store = OffsetStore(ReplicatedLog(self.context, self.leader, rep, epoch, GROUP_WRITE_TIMEOUT_S))
                self._groups = self.group_coordinators(store)  # with the consumer groups' (KIP-848)
                self._groups_epoch = epoch
            return self._groups

    def coordinator_of(self, key_type: int, key: str) -> dict[str, Any]:
        if key_type not in (0, 1):
            return super().coordinator_of(key_type, key)
        # 0: a group's coordinator leads __consumer_offsets-0; 1: a transactional id's leads
        # __transaction_state-0
        leader, topic = (self._coordinator()[0], OFFSETS_TOPIC) if key_type == 0 else \
            (self.slot.leader(), TRANSACTION_STATE_TOPIC)
        if leader not in self.kafka_brokers:
            return {"error_code": ErrorCode.coordinator_not_available,
                    "error_message": f"no leader of {topic}-0 yet", "node_id": -1, "host": "", "port": -1}
        host, port = self.kafka_brokers[leader]
        return {"error_code": ErrorCode.none, "error_message": None, "node_id": leader, "host": host, "port": port}

    def subscribable_topics(self) -> dict[str, tuple[uuid.UUID, int]]:
        counts: dict[str, int] = {}
        for topic, partition in self.context.replicas:
            if not is_internal_topic(topic):
                counts[topic] = max(counts.get(topic, 0), partition + 1)
        return {name: (self.store.topic_id(name), count) for name, count in counts.items()}

    def _replica(self, topic: str, partition: int) -> PartitionReplica | None:
        return self.context.replica(topic, partition)

    def partition_error(self, topic: str, partition: int) -> int:
        rep = self._replica(topic, partition)
        if rep is None:
            return ErrorCode.unknown_topic_or_partition
        leading = rep.election.role is Role.LEADER  # read without its lock
        return ErrorCode.none if leading else ErrorCode.not_leader_or_follower

    # ------------------------------------------------------------------ the cluster and its topics
    # (Metadata, DescribeTopicPartitions and DescribeCluster: KafkaApis answers from these)
    def brokers(self) -> list[dict[str, Any]]:
        return [{"node_id": n, "host": host, "port": port, "rack": None}
                for n, (host, port) in sorted(self.kafka_brokers.items())]

    def known_topics(self) -> list[str]:
        return sorted({t for t, _ in self.context.replicas if t != METADATA_TOPIC})  # (Kafka's hides it too)

    def partition_states(self, name: str) -> list[dict[str, Any]]:
        partitions = sorted(p for t, p in self.context.replicas if t == name)
        if not partitions:
            raise UnknownTopicOrPartitionError(f"topic {name!r} is not replicated by this cluster")
        return [self._partition(name, p) for p in partitions]

    def leader_epoch(self, topic: str, partition: int) -> int:
        rep = self._replica(topic, partition)
        return -1 if rep is None else rep.election.epoch  # read without its lock

    def leader_hint(self, topic: str, partition: int) -> tuple[int, int] | None:
        rep = self._replica(topic, partition)
        if rep is None:
            return None
        with rep.cond:
            leader, epoch = rep.election.leader, rep.election.epoch
        return (leader, epoch) if leader != NO_LEADER and leader in self.kafka_brokers else None

    def _partition(self, topic: str, partition: int) -> dict[str, Any]:
        rep = self._replica(topic, partition)
        voters = list(self.context.voters)
        with rep.cond:
            election = rep.election
            leader, epoch = election.leader, election.epoch
            isr = voters
            if election.role is Role.LEADER:
                isr = sorted([self.node_id] + self.leader.in_sync_followers(rep, time.monotonic()))
        if leader == NO_LEADER or leader not in self.kafka_brokers:
            return {"error_code": ErrorCode.leader_not_available, "partition_index": partition, "leader_id": -1,
                    "leader_epoch": epoch, "replica_nodes": voters, "isr_nodes": [], "offline_replicas": []}
        return {"error_code": ErrorCode.none, "partition_index": partition, "leader_id": leader, "leader_epoch": epoch,
                "replica_nodes": voters, "isr_nodes": isr, "offline_replicas": []}

    # ------------------------------------------------------------------ Produce
    def on_produce(self, request: KafkaRequest) -> dict[str, Any] | Future | None:
        body = request.body
        acks = body.acks
        timeout_s = max(0.0, body.timeout.total_seconds()) if hasattr(body.timeout, "total_seconds") \
            else body.timeout / 1000.0
        answers: list[dict[str, Any]] = []
        waiting: list[tuple[dict[str, Any], Future]] = []
        for topic in body.topic_data:
            partitions = []
            for data in topic.partition_data:
                entry = {"index": data.index, "error_code": ErrorCode.none, "base_offset": -1, "log_append_time": None,
                         "log_start_offset": -1, "record_errors": [], "error_message": None}
                if acks not in (0, 1, -1):
                    entry.update(error_code=ErrorCode.invalid_required_acks,
                                 error_message=f"acks must be 0, 1 or -1, not {acks}")
                else:
                    outcome = self._replicated_append(
                        topic.name, data.index, data.records, acks, timeout_s, body.transactional_id,
                        peer=request.principal == f"User:{REPLICA_USER}" and topic.name == REMOTE_LOG_METADATA_TOPIC)
                    if isinstance(outcome, Future):
                        waiting.append((entry, outcome))
                    else:
                        self._settle(entry, topic.name, outcome)
                partitions.append(entry)
            answers.append({"name": topic.name, "partition_responses": partitions})
        answer = {"responses": answers, "throttle_time": 0}
        if acks == 0:
            return None
        if not waiting:
            return self._with_endpoints(answer)
        done: Future = Future()
        left = [len(waiting)]
        lock = threading.Lock()

        def one(entry: dict[str, Any], topic: str, future: Future) -> None:
            self._settle(entry, topic, future.result())
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                done.set_result(self._with_endpoints(answer))

        names = {id(entry): t["name"] for t in answers for entry in t["partition_responses"]}
        for entry, future in waiting:
            future.add_done_callback(lambda f, e=entry: one(e, names[id(e)], f))
        return done

    def _settle(self, entry: dict[str, Any], topic: str, outcome: tuple[int, int, str | None]) -> None:
        error, base, message = outcome
        entry.update(error_code=error, base_offset=base, error_message=message)
        if error == ErrorCode.none:
            entry["log_start_offset"] = self._log_start(topic, entry["index"])
        elif error == ErrorCode.not_leader_or_follower:  # v10+ (KIP-951): where to go instead
            hint = self.leader_hint(topic, entry["index"])
            if hint is not None:
                entry["current_leader"] = {"leader_id": hint[0], "leader_epoch": hint[1]}

    def _with_endpoints(self, answer: dict[str, Any]) -> dict[str, Any]:
        """A produce answer with the ``node_endpoints`` of the leaders its refusals name (v10+)."""
        named = {e["current_leader"]["leader_id"] for t in answer["responses"] for e in t["partition_responses"]
                 if "current_leader" in e}
        answer["node_endpoints"] = self._endpoints(named)
        return answer

    def _replicated_append(self, topic: str, partition: int, records: bytes | None, acks: int,
                           timeout_s: float, transactional_id: str | None = None, peer: bool = False
                           ) -> tuple[int, int, str | None] | Future:
        """Append on the leader: an outcome (error, base offset, message) now, or its Future
        (acks=all, until the high watermark passes the batch). A transactional batch that opens
        its producer's transaction in the partition is verified with the coordinator first. An
        internal topic (``__acls``, ``__consumer_offsets``, ...) is refused to every client;
        ``peer``: a peer's write of the remote segments' metadata (replica.tiering), taken."""
        refused_internal = None if peer else internal_topic_refusal(topic)
        if refused_internal is not None:
            logger.info("refused a produce to %s-%d: %s", topic, partition, refused_internal[2])
            return refused_internal
        rep = self._replica(topic, partition)
        if rep is None:
            return ErrorCode.unknown_topic_or_partition, -1, f"{topic}-{partition} is not replicated by this cluster"
        if records is None:
            return ErrorCode.corrupt_message, -1, "null records"
        refused = one_v2_batch_problem(records)
        if refused is None:
            try:  # checked before the lock: a bad batch costs the sender, not the partition
                header = validate_client_batch(records, rep.log.config.max_message_bytes)
            except (CorruptRecordError, RecordTooLargeError, InvalidRecordError, UnsupportedCodecError) as exc:
                return code_for(exc), -1, str(exc)
            if header.attributes & lib.LS_ATTR_TRANSACTIONAL and (
                    not transactional_id or header.producer_id not in rep.log.producer_transactions()):
                # The batch opens the producer's transaction here: the coordinator must know
                # the partition is in it (KIP-890), else nothing would ever end it. (Without a
                # transactional id it is refused, as by the single store's listener.)
                error, message = self._verify_transactional(topic, partition, header.producer_id,
                                                            header.producer_epoch, transactional_id)
                if error != ErrorCode.none:
                    logger.info("refused a transactional produce to %s-%d: %s", topic, partition, message)
                    return error, -1, message
        else:
            return ErrorCode.invalid_record, -1, refused
        context, leader = self.context, self.leader
        with context.purgatory.deferred(), rep.cond:
            election = rep.election
            if election.role is not Role.LEADER:
                return ErrorCode.not_leader_or_follower, -1, f"node {self.node_id} does not lead {topic}-{partition}"
            epoch = election.epoch
            if acks == -1:
                in_sync = 1 + len(leader.in_sync_followers(rep, time.monotonic()))
                if in_sync < context.min_insync:
                    return (ErrorCode.not_enough_replicas, -1,
                            f"{in_sync} in-sync replicas, min.insync.replicas is {context.min_insync}")
            try:
                first, last, duplicate = rep.log.append_idempotent(records)
            except (CorruptRecordError, RecordTooLargeError, OutOfOrderSequenceError, InvalidProducerEpochError,
                    InvalidRecordError) as exc:
                logger.info("refused a produce to %s-%d: %s", topic, partition, exc)
                return code_for(exc), -1, str(exc)
            if not duplicate:
                leader.advance_hw(rep)  # a set of one commits on its own append
                rep.changed()  # answer the followers' held fetches
        if acks != -1:
            return ErrorCode.none, first, None
        return leader.await_commit(rep, epoch, first, last, timeout_s)

    # ------------------------------------------------------------------ topics and producer ids
    def replica_nodes(self) -> list[int]:
        """Every partition's replicas: the voters."""
        return list(self.context.voters)

    def make_topic(self, name: str, partitions: int, configs: dict[str, str | None]) -> tuple[int, str | None]:
        """CreateTopics' creation, replicated (:meth:`ReplicatedMetadata.create_topic`; the
        request came to, or was forwarded to, the metadata's leader)."""
        try:
            self.metadata.create_topic(name, partitions, {k: v for k, v in configs.items() if v is not None})
        except TopicExistsError:
            return ErrorCode.topic_already_exists, f"topic {name!r} already exists"
        except InvalidTopicError as exc:
            return ErrorCode.invalid_topic_exception, str(exc)
        except InvalidPartitionsError as exc:
            return ErrorCode.invalid_partitions, str(exc)
        except (InvalidConfigError, TypeError, ValueError) as exc:
            return ErrorCode.invalid_config, str(exc)
        except NotLeaderOrFollowerError as exc:
            return ErrorCode.not_controller, str(exc)
        except RequestTimedOutError as exc:
            return ErrorCode.request_timed_out, str(exc)
        except (OSError, LogstoreError) as exc:
            logger.error("creating topic %s failed: %s", name, exc)
            return ErrorCode.kafka_storage_error, str(exc)
        return ErrorCode.none, None

    def on_delete_topics(self, request: KafkaRequest) -> dict[str, Any]:
        return {"throttle_time": 0, "responses": [
            {"name": name, "topic_id": topic_id or ZERO_TOPIC_ID, "error_code": error or ErrorCode.policy_violation,
             "error_message": message or "a replica set's topics are never deleted (each node derives a topic's "
                                         "id from its name)"}
            for name, topic_id, error, message in delete_topics_asked(request)]}

    def on_alter_user_scram_credentials(self, request: KafkaRequest) -> dict[str, Any]:
        """Refused: each node's SASL users are its own credentials file (``logstore kafka-user``
        on every node), which the set does not replicate."""
        names = dict.fromkeys([d.name for d in request.body.deletions] + [u.name for u in request.body.upsertions])
        return {"throttle_time": 0, "results": [
            {"user": name, "error_code": ErrorCode.policy_violation,
             "error_message": "a replica set's SASL users are each node's credentials file (logstore kafka-user), "
                              "not replicated: alter them on every node"} for name in names]}

    def _move_log_start(self, topic: str, partition: int, log: Any, offset: int,
                        timeout_s: float) -> "Future[tuple[int, int]] | tuple[int, int]":
        """DeleteRecords as the partition's leader (:meth:`LeaderSide.delete_records`)."""
        rep = self._replica(topic, partition)
        if rep is None:
            return ErrorCode.unknown_topic_or_partition, -1
        return self.leader.delete_records(rep, offset, timeout_s)

    def _new_producer_id(self) -> int:
        """A producer id unique across the replica set (see the module docstring)."""
        return self.producer_ids.next_id() * self._stride + self.node_id

    def on_init_producer_id(self, request: KafkaRequest) -> dict[str, Any]:
        if request.body.transactional_id is not None:
            coordinator, error = self.slot.coordinator()
            if coordinator is None:
                return {"throttle_time": 0, "error_code": error, "producer_id": -1, "producer_epoch": -1}
            return super().on_init_producer_id(request)
        return {"throttle_time": 0, "error_code": ErrorCode.none, "producer_id": self._new_producer_id(),
                "producer_epoch": 0}

    # ------------------------------------------------------------------ transactions
    @property
    def txn(self) -> TransactionCoordinator:
        """The coordinator the transaction handlers use: the slot's (they run once
        :meth:`_txn_coordinated` found it live; one closed meanwhile answers
        COORDINATOR_NOT_AVAILABLE itself)."""
        coordinator = self.slot.last
        if coordinator is None:
            raise LogstoreError(f"node {self.node_id} has not coordinated transactions")
        return coordinator

    def _txn_coordinated(self, handler: Any, refusal: Any) -> Any:
        def answer(request: KafkaRequest) -> Any:
            if request.api_key == 24 and request.api_version >= 4:
                return handler(request)  # a peer's verification: answers for itself
            coordinator, error = self.slot.coordinator()
            if coordinator is None:
                return refusal(request, error)
            return handler(request)
        return answer

    def verify_partition(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         tp: tuple[str, int]) -> int:
        return self.verifier.verify(transactional_id, producer_id, producer_epoch, tp)

    def on_add_partitions_to_txn(self, request: KafkaRequest) -> dict[str, Any]:
        if request.api_version < 4:
            return super().on_add_partitions_to_txn(request)
        # v4: a partition leader verifying a transactional batch (only peers may ask)
        refused = self.peer_apis.refusal(request)
        if not refused:
            coordinator, refused = self.slot.coordinator()
        if refused:
            return {"throttle_time": 0, "error_code": refused, "results_by_transaction": []}
        results = []
        for txn in request.body.transactions:
            wanted = [(t.name, p) for t in txn.topics for p in t.partitions]
            if txn.verify_only:
                errors = coordinator.verify_partitions(txn.transactional_id, txn.producer_id, txn.producer_epoch,
                                                       wanted)
            else:
                errors = coordinator.add_partitions(txn.transactional_id, txn.producer_id, txn.producer_epoch, wanted)
            topics: dict[str, list[dict[str, Any]]] = {}
            for name, p in wanted:
                topics.setdefault(name, []).append({"partition_index": p,
                                                    "partition_error_code": errors.get((name, p), ErrorCode.none)})
            results.append({"transactional_id": txn.transactional_id,
                            "topic_results": [{"name": n, "results_by_partition": r} for n, r in topics.items()]})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "results_by_transaction": results}

    def on_add_offsets_to_txn(self, request: KafkaRequest) -> dict[str, Any]:
        body = request.body  # (__consumer_offsets is replicated from the start)
        error = self.txn.add_offsets(body.transactional_id, body.producer_id, body.producer_epoch, body.group_id,
                                     lambda group: 0)  # every group's offsets are in partition 0
        return {"throttle_time": 0, "error_code": self._txn_error(error, request.api_version, 2)}

    def on_list_transactions(self, request: KafkaRequest) -> dict[str, Any]:
        """At the coordinator, its transactions; at any other node none (admin clients ask
        every broker and merge the answers)."""
        coordinator, _ = self.slot.coordinator()
        if coordinator is None:
            return {"throttle_time": 0, "error_code": ErrorCode.none, "unknown_state_filters": [],
                    "transaction_states": []}
        return super().on_list_transactions(request)


def _host_bytes(client_host: str) -> bytes:
    """A client's address as an Envelope carries it (Kafka's: the IP's 4 or 16 bytes; empty when
    it is none, as a Unix socket's)."""
    try:
        return ipaddress.ip_address(client_host.lstrip("/")).packed
    except ValueError:
        return b""


def _host_text(raw: bytes) -> str:
    """:func:`_host_bytes` back to the form a request's ``client_host`` has (``/127.0.0.1``).

    Raises:
        ValueError: neither 4 nor 16 bytes, nor empty."""
    return "/" + str(ipaddress.ip_address(raw)) if raw else ""


#: the topic changes the leader of ``__cluster_metadata-0`` makes: CreateTopics, AlterConfigs,
#: CreatePartitions, IncrementalAlterConfigs
_METADATA_CHANGES = (19, 33, 37, 44)


def _changes_topics(request: KafkaRequest) -> bool:
    """Whether ``request`` (one of :data:`_METADATA_CHANGES`) changes a topic: the config APIs
    may name only brokers and groups, whose configs are each node's (refused by policy)."""
    if request.api_key in (33, 44):
        return any(r.resource_type == TOPIC for r in request.body.resources)
    return True


def _refuse_acl_change(results: str, listed: Any, error: int, message: str) -> dict[str, Any]:
    """CreateAcls' or DeleteAcls' answer refusing every creation or filter."""
    entry: dict[str, Any] = {"error_code": error, "error_message": message}
    if results == "filter_results":
        entry["matching_acls"] = []
    return {"throttle_time": 0, results: [dict(entry) for _ in listed]}


def _refuse_init(request: KafkaRequest, error: int) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": error, "producer_id": -1, "producer_epoch": -1}


def _refuse_add_partitions(request: KafkaRequest, error: int) -> dict[str, Any]:
    body = request.body
    if request.api_version >= 4:
        return {"throttle_time": 0, "error_code": error, "results_by_transaction": []}
    return {"throttle_time": 0, "error_code": error, "results_by_transaction": [],
            "results_by_topic_v3_and_below": [
                {"name": t.name, "results_by_partition": [{"partition_index": p, "partition_error_code": error}
                                                          for p in t.partitions]}
                for t in body.v3_and_below_topics]}


def _refuse_describe_txns(request: KafkaRequest, error: int) -> dict[str, Any]:
    return {"throttle_time": 0, "transaction_states": [
        {"error_code": error, "transactional_id": tid, "transaction_state": "", "transaction_timeout": 0,
         "transaction_start_time": -1, "producer_id": -1, "producer_epoch": -1, "topics": []}
        for tid in request.body.transactional_ids]}


#: the transaction requests only the coordinator answers, and the others' answer (with the
#: slot's error: NOT_COORDINATOR, or COORDINATOR_LOAD_IN_PROGRESS while it takes the state up).
#: v4 of AddPartitionsToTxn answers for itself (a peer's verification).
_TXN_REFUSALS: dict[int, Any] = {
    24: _refuse_add_partitions,
    25: lambda request, error: {"throttle_time": 0, "error_code": error},
    26: lambda request, error: {"throttle_time": 0, "error_code": error, "producer_id": -1, "producer_epoch": -1},
    65: _refuse_describe_txns,
}


def _refuse_join(request: KafkaRequest) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator, "generation_id": -1, "protocol_name": "",
            "leader": "", "member_id": request.body.member_id, "members": []}


def _refuse_leave(request: KafkaRequest) -> dict[str, Any]:
    members = getattr(request.body, "members", None) or []
    return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator,
            "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                         "error_code": ErrorCode.not_coordinator} for m in members]}


def _refuse_commit(request: KafkaRequest) -> dict[str, Any]:
    return {"throttle_time": 0, "topics": [
        {"name": t.name, "partitions": [{"partition_index": p.partition_index, "error_code": ErrorCode.not_coordinator}
                                        for p in t.partitions]} for t in request.body.topics]}


def _refuse_offset_fetch(request: KafkaRequest) -> dict[str, Any]:
    """As Kafka's: each partition asked for with the error too (clients read those first); from
    v8 each group so."""
    def refused(topics: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "partitions": [{"partition_index": p, "committed_offset": -1,
                                                 "committed_leader_epoch": -1, "metadata": "",
                                                 "error_code": ErrorCode.not_coordinator}
                                                for p in t.partition_indexes]} for t in topics or []]

    body = request.body
    if request.api_version >= 8:
        return {"throttle_time": 0, "groups": [{"group_id": g.group_id, "error_code": ErrorCode.not_coordinator,
                                                "topics": refused(g.topics)} for g in body.groups]}
    return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator, "topics": refused(body.topics)}


def _refuse_describe(request: KafkaRequest) -> dict[str, Any]:
    return {"throttle_time": 0, "groups": [
        {"error_code": ErrorCode.not_coordinator, "error_message": None, "group_id": g, "group_state": "",
         "protocol_type": "", "protocol_data": "", "members": [], "authorized_operations": -2147483648}
        for g in request.body.groups]}


#: the group requests only the coordinator answers, and the others' NOT_COORDINATOR answer
_GROUP_REFUSALS: dict[int, Any] = {
    11: _refuse_join,
    14: lambda request: {"throttle_time": 0, "error_code": ErrorCode.not_coordinator, "assignment": b""},
    12: lambda request: {"throttle_time": 0, "error_code": ErrorCode.not_coordinator},
    13: _refuse_leave,
    8: _refuse_commit,
    9: _refuse_offset_fetch,
    15: _refuse_describe,
    16: lambda request: {"throttle_time": 0, "error_code": ErrorCode.none, "groups": []},
    28: _refuse_commit,  # TxnOffsetCommit goes to the group's coordinator
    42: lambda request: {"throttle_time": 0, "results": [{"group_id": g, "error_code": ErrorCode.not_coordinator}
                                                         for g in request.body.groups_names]},
    47: lambda request: {"throttle_time": 0, "error_code": ErrorCode.not_coordinator, "topics": []},
    68: lambda request: {"throttle_time": 0, "error_code": ErrorCode.not_coordinator,
                         "error_message": "not the group coordinator", "member_id": request.body.member_id or None,
                         "member_epoch": -1, "heartbeat_interval": 0, "assignment": None},
    69: lambda request: {"throttle_time": 0, "groups": [
        {"error_code": ErrorCode.not_coordinator, "error_message": None, "group_id": g, "group_state": "",
         "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "", "members": [],
         "authorized_operations": -2147483648} for g in request.body.group_ids]},
}
