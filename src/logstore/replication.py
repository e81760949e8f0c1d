"""Replication's node: :class:`ReplicaNode`, one replica of a leader/follower set over TCP, and
the ``logstore node`` command.

Each replicated partition is its own Raft group (KIP-595's rules, replica/quorum.py): its replicas
elect a leader per epoch (Kafka's Vote and BeginQuorumEpoch requests); the leader stamps its
epoch into every batch it appends; followers fetch from the leader with Kafka's Fetch (replica
id, fetch offset, last fetched epoch) and either get batches (copied byte for byte), or a
diverging (epoch, end offset) that makes them truncate (KIP-101/KIP-279/KIP-320); the high
watermark is the offset held by a majority and only advances over records of the leader's own
epoch. acks=all waits for the high watermark; a leader that a higher epoch deposed can never
advance it again, so it can never acknowledge.

A node serves one listener, Kafka's protocol, to Kafka clients and its peers alike: a replica
set is a Kafka cluster to its clients (:mod:`~logstore.replica.kafkaapis`), and its peers' requests
are Kafka's (:mod:`~logstore.replica.peerapis`), authenticated with SASL as
:data:`~logstore.replica.client.REPLICA_USER` and the set's shared secret.

The node builds what its parts share, a :class:`~logstore.replica.context.NodeContext` (its
identity and peers, the settings, the replicated partitions, the stop flag, the peer
connections, the purgatory), and hands it to each part; a part that acts on another is given
that part. The parts live in :mod:`logstore.replica`, named for what they hold:

==========================  =====================================================================
replica/context.py          ``NodeContext``: what the node's parts share
replica/partition.py        per-partition state (log, election, timers, follower progress)
replica/quorum.py           KRaft's voting rules and the ``quorum-state`` file
replica/elections.py        election driving: timers, pre-vote, campaigns, Vote, BeginQuorumEpoch
replica/leader.py           the leader's side: taking up an epoch, followers' fetches, HW, ISR
replica/follower.py         the follower's fetcher threads
replica/kafkaapis.py        the listener's answers to Kafka clients (Metadata, Produce, Fetch, groups)
replica/metadata.py         topic configs and new partitions, replicated in ``__cluster_metadata``
replica/peerapis.py         the listener's answers to peers (Fetch, Vote, BeginQuorumEpoch, DescribeQuorum)
replica/client.py           ``Client``, connections to nodes and peers, the replication errors
replica/tiering.py          tiered storage: ``__remote_log_metadata`` replicated, who copies, a follower's start past the tier
kafka/server.py, net/       the listener every connection is served by
log/producers.py            (log layer) each producer's epoch and last batches, for idempotent produces
==========================  =====================================================================

This module is replication's public face: :class:`ReplicaNode`, ``logstore node`` (:func:`main`),
and, from :mod:`~logstore.replica.client`, :class:`Client` with its errors, and public names for
the Kafka error codes their ``code`` carries (``from logstore.replication import Client,
NotLeaderError, NOT_LEADER``; every code is a member of :class:`~logstore.errorcodes.ErrorCode`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Iterable

from .checkpoint import REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpoints
from .errorcodes import ErrorCode
from .errors import LogstoreError, OffsetOutOfRangeError
from .groups.offsets import OFFSETS_TOPIC, OFFSETS_TOPIC_CONFIG
from .txn.metadata import TRANSACTION_STATE_TOPIC, TRANSACTION_STATE_TOPIC_CONFIG
from .replica.acls import ACLS_TOPIC, ACLS_TOPIC_CONFIG
from .replica.metadata import METADATA_TOPIC, METADATA_TOPIC_CONFIG, ReplicatedMetadata, known_partitions
from .kafka.credentials import Credentials, CredentialsFile
from .kafka.server import (KafkaServer, add_authorizer_arguments, add_consumer_group_arguments, add_sasl_arguments,
                           add_transaction_arguments, authorizer_options, consumer_group_config, sasl_options,
                           transaction_config)
from .net import server as net
from .net.protocol import TLSConfig
from .net.purgatory import Purgatory
from .records.batch import Record
from .replica.client import (
    REPLICA_USER,
    Client,
    Fetched,
    NotEnoughReplicasError,
    NotLeaderError,
    ReplicationError,
    ReplicationTimeoutError,
    replica_password,
)
from .replica.context import NodeContext, check_cluster_id, default_cluster_id, replica_topic_id
from .replica.elections import ElectionDriver
from .replica.follower import Fetchers
from .replica.kafkaapis import ReplicaKafkaApis
from .replica.leader import LeaderSide
from .replica.partition import PartitionReplica
from .replica.peerapis import PeerApis
from .replica.quorum import NONE, Election, QuorumStateFile, Role
from .replica.tiering import (REMOTE_LOG_METADATA_CONFIG, REMOTE_LOG_METADATA_TOPIC, PartitionLeadership,
                              RemoteMetadataLog, TierCatchUp)
from .store.layout import read_remote_storage
from .store.store import LogStore, meta_properties
from .tiered.rlmm import TopicBasedRemoteLogMetadataManager
from .tiered.objectstore import parse_options

__all__ = ["ReplicaNode", "Client", "Fetched", "TLSConfig", "ReplicationError", "NotLeaderError",
           "NotEnoughReplicasError", "ReplicationTimeoutError", "REPLICA_USER", "main",
           # the Kafka error codes a ReplicationError's ``code`` carries
           "OK", "OUT_OF_RANGE", "CORRUPT_BATCH", "UNKNOWN_PARTITION", "NOT_LEADER", "TIMEOUT", "RECORD_TOO_LARGE",
           "NOT_ENOUGH_REPLICAS", "INVALID", "FENCED_EPOCH", "INVALID_RECORD"]

# The public names of ReplicationError.code's values (and of the codes in a node's answers):
# aliases of logstore.errorcodes.ErrorCode's members, Kafka's codes, equal to their ints.
OK = ErrorCode.none
OUT_OF_RANGE = ErrorCode.offset_out_of_range
CORRUPT_BATCH = ErrorCode.corrupt_message
UNKNOWN_PARTITION = ErrorCode.unknown_topic_or_partition
NOT_LEADER = ErrorCode.not_leader_or_follower
TIMEOUT = ErrorCode.request_timed_out
RECORD_TOO_LARGE = ErrorCode.message_too_large
NOT_ENOUGH_REPLICAS = ErrorCode.not_enough_replicas
INVALID = ErrorCode.invalid_request
FENCED_EPOCH = ErrorCode.fenced_leader_epoch
INVALID_RECORD = ErrorCode.invalid_record

#: the largest request a node's listener accepts by default (a fetch answer's batches are
#: bounded by ``fetch_max_bytes``; a produce's by the topic's max.message.bytes)
DEFAULT_MAX_FRAME = 100 * 1024 * 1024

logger = logging.getLogger("logstore.replication")


#: the topics a node always replicates (one partition each), with their configs
_INTERNAL_TOPICS = {OFFSETS_TOPIC: OFFSETS_TOPIC_CONFIG, TRANSACTION_STATE_TOPIC: TRANSACTION_STATE_TOPIC_CONFIG,
                    ACLS_TOPIC: ACLS_TOPIC_CONFIG, METADATA_TOPIC: METADATA_TOPIC_CONFIG,
                    REMOTE_LOG_METADATA_TOPIC: REMOTE_LOG_METADATA_CONFIG}


class _ContextSetting:
    """A :class:`ReplicaNode` attribute whose one home is the node's :class:`NodeContext`,
    where the node's parts read it at each use: getting or setting it on the node gets or sets
    the context's."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, node: ReplicaNode | None, owner: type | None = None) -> Any:
        return self if node is None else getattr(node.context, self.name)

    def __set__(self, node: ReplicaNode, value: Any) -> None:
        setattr(node.context, self.name, value)


class ReplicaNode:
    """A process serving a LogStore's partitions as one replica of a set of 2f+1 nodes.

    Args:
        node_id: this node's id (an int >= 0), unique in the set.
        data_dir: its LogStore root.
        listen: (host, port) of its listener (loopback unless told otherwise): Kafka's protocol,
            for Kafka clients, :class:`Client` and the peers, with SASL (over TLS with ``tls``).
        peers: {node id: (host, port)}: the other replicas' listeners, as this node reaches
            them and as Metadata names them to clients.
        secret: the shared secret (UTF-8 text): the password of the SASL user
            :data:`~logstore.replica.client.REPLICA_USER`, which peers and :class:`Client`
            log in as and which alone may send replication's requests.
        partitions: [(topic, partitions)] to replicate (created when missing). Kafka clients'
            ``__consumer_offsets`` and ``__transaction_state`` are always replicated, one
            partition each: their leaders coordinate the groups and the transactions; with
            an authorizer (``kafka_options``' ``authorizer``), ``__acls`` too: the ACLs; and
            ``__cluster_metadata``, the topic changes made at runtime (CreatePartitions, topic
            configs: :mod:`~logstore.replica.metadata`). A topic's count here is its count when
            it is created; CreatePartitions grows it, and the metadata wins over the count
            named at a later start. The topics CreateTopics made are replicated too.
        election_timeout_ms: base election timeout (randomised up to twice it).
        replica_lag_time_max_ms: a follower is in sync while it reached the leader's end this
            recently.
        replica_fetch_wait_max_ms: how long a caught-up follower's fetch waits at the leader
            for new records (at most half the election timeout).
        min_insync_replicas: acks=all needs this many in-sync replicas (leader included).
        fetch_max_bytes: the most batch bytes one follower fetch answer carries (at least one
            batch).
        max_frame: the largest request the listener accepts (Kafka's socket.request.max.bytes).
        tls: TLS for the listener and the connections to peers; with ``cafile``, client
            certificates are required (mutual TLS).
        max_connections: connections served at once; more are closed as they arrive.
        connections_max_idle_ms: a served connection that sends no request for this long is
            closed (Kafka's name); the SASL login must finish within ``handshake_timeout_ms``.
        advertised: (host, port) that Metadata names for this node (default: the bound one).
        advertised_peers: {node id: (host, port)} that Metadata names for the peers (default:
            ``peers``; differs when this node reaches its peers another way, e.g. a proxy).
        cluster_id: the set's cluster id (Kafka's ``cluster.id``, what ``kafka-storage
            random-uuid`` prints; the same on every node), kept in the data directory's
            ``meta.properties``; a directory that belongs to another cluster refuses to start.
            None: the one the directory keeps, else one derived from the voters' ids
            (:func:`~logstore.replica.context.default_cluster_id`, the same on every node, and
            kept from then on). Never derived from the secret, which a client reading the id
            could otherwise guess.
        kafka_options: more :class:`~logstore.kafka.server.KafkaServer` arguments, e.g.
            ``sasl_credentials`` (Kafka clients' users, besides the replica user),
            ``sasl_mechanisms``, group settings.
        remote_storage: tiered storage (KIP-405): the object store the whole set shares, a URL
            (``file:///path``, ``s3://bucket/prefix``, ...) or a
            :class:`~logstore.tiered.storage.RemoteStorageManager`; the same on every node (a
            URL is remembered by the data directory, as a store's). Topics with
            ``remote.storage.enable`` are tiered: each partition's leader copies its sealed
            segments and expires remote ones, every node's local retention drops what the tier
            holds and reads below its local segments from it; the remote segments' metadata is
            the replicated ``__remote_log_metadata`` (one partition; see
            :mod:`~logstore.replica.tiering`). None: the one the directory remembers, if any;
            else no topic may enable remote storage.
        remote_storage_options: the object store's settings (obstore's names).
        remote_log_manager_task_interval_ms: Kafka's ``remote.log.manager.task.interval.ms``:
            how often each node's copies, expirations and local retention of tiered partitions
            run.

    Connections are served by one event loop (``net.Server``, under ``KafkaServer``); requests
    run on its worker threads. The node's own threads are the tick thread (election timers, the
    high watermark checkpoint), one fetcher per partition, and the transaction coordinator's
    (``replica-<id>-txn``, which takes the coordinator up and down with the leadership of
    ``__transaction_state``; its marker thread; one marker sender per peer).

    Durability: records are appended with the store's flush policy (page cache by default);
    acks=all means held by a majority, not fsynced by one. Thread-safety: start() and stop()
    from one thread; every other method may be called from any thread.

    The settings ``node_id``, ``peers``, ``voters``, ``secret``, ``cluster_id``,
    ``election_timeout_s``, ``replica_lag_s``, ``fetch_wait_s``, ``min_insync`` and
    ``fetch_max_bytes``, and the shared ``purgatory`` and ``peer_connections``, live in the
    node's :attr:`context`, where its parts read them at each use: one set on the node takes
    effect at its next use.
    """

    node_id = _ContextSetting()
    peers = _ContextSetting()
    voters = _ContextSetting()
    secret = _ContextSetting()
    cluster_id = _ContextSetting()
    election_timeout_s = _ContextSetting()
    replica_lag_s = _ContextSetting()
    fetch_wait_s = _ContextSetting()
    min_insync = _ContextSetting()
    fetch_max_bytes = _ContextSetting()
    purgatory = _ContextSetting()
    peer_connections = _ContextSetting()

    def __init__(self, node_id: int, data_dir: str, listen: tuple[str, int] = ("127.0.0.1", 0),
                 peers: dict[int, tuple[str, int]] | None = None, secret: bytes = b"", *,
                 partitions: Iterable[tuple[str, int]] = (("replicated", 1),),
                 election_timeout_ms: int = 1000, replica_lag_time_max_ms: int = 10_000,
                 replica_fetch_wait_max_ms: int = 500,
                 min_insync_replicas: int = 2, fetch_max_bytes: int = 1 << 20, max_frame: int = DEFAULT_MAX_FRAME,
                 tls: TLSConfig | None = None, max_connections: int = 256,
                 connections_max_idle_ms: int = 600_000, handshake_timeout_ms: int = 10_000,
                 advertised: tuple[str, int] | None = None,
                 advertised_peers: dict[int, tuple[str, int]] | None = None,
                 cluster_id: str | None = None,
                 kafka_options: dict[str, Any] | None = None, remote_storage: Any = None,
                 remote_storage_options: dict[str, str] | None = None,
                 remote_log_manager_task_interval_ms: int = 30_000) -> None:
        if not secret:
            raise ValueError("a shared secret is required")
        password = replica_password(secret)
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if connections_max_idle_ms <= 0 or handshake_timeout_ms <= 0:
            raise ValueError("connections_max_idle_ms and handshake_timeout_ms must be > 0")
        options = dict(kafka_options or {})
        for reserved in ("tls", "limits", "advertised", "node_id", "apis_factory", "max_request_bytes",
                         "auto_create_topics"):
            if reserved in options:
                raise ValueError(f"kafka_options may not set {reserved!r}: it is the node's own setting")
        peers = dict(peers or {})
        if advertised_peers is not None and set(advertised_peers) != set(peers):
            raise ValueError(f"advertised_peers names nodes {sorted(advertised_peers)}, the peers are "
                             f"{sorted(peers)}")
        election_timeout_s = election_timeout_ms / 1000.0
        self.max_frame = max_frame
        self.max_connections = max_connections
        self.idle_s = connections_max_idle_ms / 1000.0
        self.handshake_s = handshake_timeout_ms / 1000.0
        if tls is not None and not tls.mutual:
            # Without a private CA, peers would accept any publicly issued certificate.
            raise ValueError("replication needs mutual TLS: TLSConfig.cafile (the CA peers' certificates chain to)")
        mechanisms = options.get("sasl_mechanisms")
        if mechanisms is not None and "SCRAM-SHA-256" not in mechanisms:
            raise ValueError("kafka_options' sasl_mechanisms must include SCRAM-SHA-256 (the peers log in with it)")
        client_tls = tls.client_context() if tls is not None else None
        credentials = _ReplicaCredentials(password, options.pop("sasl_credentials", None),
                                          options.get("sasl_mechanisms"))
        # The set's cluster id: given, or kept by the directory, or the voters' default.
        kept = meta_properties(data_dir).get("cluster.id") or None
        if cluster_id is not None:
            check_cluster_id(cluster_id)
            if kept is not None and kept != cluster_id:
                raise LogstoreError(f"{data_dir} belongs to cluster {kept}, not {cluster_id} (its meta.properties' "
                                    "cluster.id): a node of one replica set cannot join another")
        chosen: str = kept or cluster_id or default_cluster_id(sorted(set(peers) | {node_id}))
        if not kept and not cluster_id:
            logger.info("node %d: no --cluster-id given: the set takes %s, derived from its node ids (every set "
                        "of the same ids takes the same one: give sets that may meet their own)", node_id, chosen)
        # Every node derives a topic's id from the set's cluster id and the topic's name (see
        # replica_topic_id), for the topics it creates and those of a store older than topic ids;
        # a topic keeps the id it has.
        # Tiered storage: one object store for the whole set; each node tiers the partitions it
        # leads, and the remote segments' metadata is the replicated __remote_log_metadata-0
        # (replica.tiering). Both hooks are bound to the node's parts once they exist.
        self._remote_metadata_log: RemoteMetadataLog | None = None
        self._leadership: PartitionLeadership | None = None
        # (a directory that tiered before remembers its object store: it tiers on without the URL)
        tiered = remote_storage is not None or read_remote_storage(data_dir) is not None
        self.store = LogStore(data_dir, shared=False, maintenance=False,
                              topic_ids=lambda name: replica_topic_id(chosen, name), remote_storage=remote_storage,
                              remote_storage_options=remote_storage_options,
                              remote_log_metadata_manager=self._remote_metadata_manager,
                              remote_log_leads=lambda log: self._leadership is not None and self._leadership(log),
                              remote_log_manager_task_interval_ms=remote_log_manager_task_interval_ms,
                              remote_log_broker_id=node_id)
        try:
            self.store.set_cluster_id(chosen)
        except BaseException:
            self.store.close()
            raise
        # The high watermark each partition had (Kafka's replication-offset-checkpoint): a
        # restarted replica must not take its uncommitted tail for committed. It is written
        # every second and at stop, so it may lag; a lower bound is safe (the leader's fetch
        # answers bring it up to date).
        self._hw_checkpoint = OffsetCheckpoints(data_dir, REPLICATION_OFFSET_CHECKPOINT)
        self._hw_written: dict[tuple[str, int], int] = self._hw_checkpoint.read()
        self._hw_written_at = time.monotonic()
        #: what the node's parts share; held fetches and acks=all produces wait in its purgatory,
        #: keyed by partition
        self.context = NodeContext(
            node_id, peers, secret, cluster_id=chosen, election_timeout_s=election_timeout_s,
            replica_lag_s=replica_lag_time_max_ms / 1000.0,
            fetch_wait_s=max(0.0, min(replica_fetch_wait_max_ms / 1000.0, election_timeout_s / 2)),
            min_insync=min_insync_replicas, fetch_max_bytes=fetch_max_bytes, client_tls=client_tls,
            purgatory=Purgatory(f"replica-{node_id}"))
        self._started = False  # start() ran: a partition added later gets its fetcher at once
        self._grow_lock = threading.Lock()  # start()'s fetchers and _grow's, one at a time
        self._metadata_moved = threading.Event()  # __cluster_metadata-0 changed: wakes the metadata's applier
        self._stop = self.context.stopping  # set by stop(); every part's loop and wait ends at it
        partitions = [(t, c) for t, c in partitions if t not in _INTERNAL_TOPICS]
        # Kafka clients' consumer groups and transactions: one partition each, whose leader
        # coordinates them
        partitions += [(OFFSETS_TOPIC, 1), (TRANSACTION_STATE_TOPIC, 1)]
        # the topic changes made at runtime (CreatePartitions, topic configs: replica.metadata)
        partitions.append((METADATA_TOPIC, 1))
        if options.get("authorizer"):  # the ACLs, replicated (replica.acls)
            partitions.append((ACLS_TOPIC, 1))
        if tiered:  # the remote segments' metadata (replica.tiering)
            partitions.append((REMOTE_LOG_METADATA_TOPIC, 1))
        # the internal topics first: __remote_log_metadata-0's replica (its high watermark) is
        # ready before a tiered topic's partition opens the remote log manager
        partitions.sort(key=lambda item: item[0] not in _INTERNAL_TOPICS)
        try:
            # and the topics CreateTopics made (the metadata's: its store has them)
            named = {t for t, _ in partitions}
            partitions += [(t, self.store.partitions_for(t)) for t in self.store.topics() if t not in named]
            for topic, count in partitions:
                if topic in _INTERNAL_TOPICS:
                    self.store.create_topic(topic, 1, exist_ok=True, internal=True, **_INTERNAL_TOPICS[topic])
                else:
                    self.store.create_topic(topic, count, exist_ok=True)
                    count = known_partitions(self.store, topic, count)  # grown by the metadata: it wins
                for p in range(count):
                    self._add_replica(topic, p)
        except BaseException:
            self.purgatory.close()
            self.store.close()
            raise
        self._threads: list[threading.Thread] = []
        self._leader = LeaderSide(self.context)
        if self._remote_metadata_log is not None:
            self._remote_metadata_log.bind(self.context, self._leader)
        self._leadership = PartitionLeadership(self.context)
        self._elections = ElectionDriver(self.context, self._leader)
        self._fetchers = Fetchers(self.context, self._elections,
                                  TierCatchUp(self.context, lambda: self.store.remote_log_manager))
        peer_apis = PeerApis(self.context, self._elections, self._leader)
        #: the set's topic metadata changed at runtime; what this node committed is applied now
        #: (again: applying is idempotent), the rest as its high watermark moves (its own thread)
        self.metadata = ReplicatedMetadata(self.context, self._leader, self.store, self._grow)
        try:
            self.metadata.catch_up()
        except BaseException:
            self.purgatory.close()
            self.store.close()
            raise
        #: every node's advertised listener, by id (what Metadata names)
        self._brokers: dict[int, tuple[str, int]] = dict(advertised_peers or self.peers)
        try:
            #: the listener (Kafka's protocol, for clients and peers)
            self.kafka = KafkaServer(self.store, listen, advertised=advertised, node_id=node_id,
                                     auto_create_topics=False, tls=tls, max_request_bytes=max_frame,
                                     limits=net.Limits(max_connections, self.handshake_s, self.idle_s),
                                     sasl_credentials=credentials, sasl_reserved_users=(REPLICA_USER,), **options,
                                     apis_factory=lambda *a, **kw: ReplicaKafkaApis(
                                         self.context, self._leader, peer_apis, self._brokers, self.metadata, *a,
                                         **kw))
        except BaseException:  # e.g. the port is taken: the store must not stay open (and locked)
            self.purgatory.close()
            self.store.close()
            raise
        self.address: tuple[str, int] = self.kafka.address
        self._brokers[node_id] = advertised or self.address

    def _remote_metadata_manager(self, log: Any) -> TopicBasedRemoteLogMetadataManager:
        """The store's remote log metadata manager (its hook, called once, when the store makes
        its remote log manager): the topic-based one over the replicated
        ``__remote_log_metadata-0``, read up to this replica's high watermark."""
        self._remote_metadata_log = RemoteMetadataLog(log)
        if getattr(self, "_leader", None) is not None:
            self._remote_metadata_log.bind(self.context, self._leader)
        return TopicBasedRemoteLogMetadataManager(self._remote_metadata_log,
                                                  read_to=self._remote_metadata_log.committed_end)

    def _add_replica(self, topic: str, p: int) -> None:
        log = self.store.partition(topic, p)
        election = Election(self.node_id, self.voters, QuorumStateFile(log.path, self.voters))
        saved = self._hw_written.get((topic, p), log.log_start_offset)
        hw = max(log.log_start_offset, min(saved, log.log_end_offset))
        log.high_watermark = hw
        # The log's producer state is loaded once, here (from its newest snapshot); appends,
        # copies and truncations keep it from then on, so a new leader's first produce never
        # replays the log.
        log.active_producers()
        self.context.add_replica(PartitionReplica(topic, p, log, election, hw=hw, on_change=self._partition_changed))

    @property
    def _replicas(self) -> dict[tuple[str, int], PartitionReplica]:
        """The replicated partitions (the context's; a new table each time one is added)."""
        return self.context.replicas

    def _grow(self, topic: str, count: int) -> None:
        """Replicate ``topic``'s partitions up to ``count`` (its store has them): the ones this
        node does not replicate yet are added, with an election timer and, once the node has
        started, a fetcher (:class:`ReplicatedMetadata`'s hook, on the thread applying a
        partitions record)."""
        with self._grow_lock:
            for p in range(count):
                if (topic, p) in self._replicas or self._stop.is_set():
                    continue
                self._add_replica(topic, p)
                logger.info("node %d: now replicating %s-%d", self.node_id, topic, p)
                if self._started:
                    rep = self._replicas[(topic, p)]
                    rep.deadline = self._elections.next_deadline(time.monotonic())
                    self._start_thread(self._fetchers.run, (rep,), f"fetch-{topic}-{p}")

    def _start_thread(self, target: Callable[..., None], args: tuple[Any, ...], name: str) -> None:
        t = threading.Thread(target=target, args=args, name=f"replica-{self.node_id}-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    # ------------------------------------------------------------------ life cycle
    def start(self) -> "ReplicaNode":
        """Start serving, electing and replicating (background threads); returns self."""
        now = time.monotonic()
        for r in self._replicas.values():
            r.deadline = self._elections.next_deadline(now)
            if r.election.leader != NONE and r.election.leader != self.node_id:
                r.log.high_watermark = min(r.hw, r.log.log_end_offset)
        self.kafka.start()
        with self._grow_lock:
            self._started = True
            # One fetcher per partition, each on its own connection, so that a long-polling
            # fetch of one partition never holds up another's.
            for r in self._replicas.values():
                self._start_thread(self._fetchers.run, (r,), f"fetch-{r.topic}-{r.partition}")
            self._start_thread(self._tick_loop, (), "tick")
            self._start_thread(self._metadata_loop, (), "metadata")
        manager = self.store.remote_log_manager  # tiered storage: copies, expiration, local retention
        if manager is not None:
            manager.start()
        return self

    def stop(self) -> None:
        """Stop every thread, close connections and the store. Not resumable."""
        self._stop.set()
        manager = self.store.remote_log_manager if self._remote_metadata_log is not None else None
        if self._remote_metadata_log is not None:
            self._remote_metadata_log.close()  # its writes blocked on the leader fail at once
        if manager is not None:
            manager.close()  # its round ends before the listener and the logs go
        self.peer_connections.close()  # requests blocked on a peer fail at once
        self.context.forward_connections.close()
        self._fetchers.close()
        for r in self._replicas.values():  # threads waiting on a partition see the stop flag
            with r.cond:
                r.cond.notify_all()
        self.purgatory.close()  # held fetches and acks=all produces are answered now
        self.kafka.stop()  # closes the listener and every connection; waits for the handlers
        for t in list(self._threads):
            t.join(5)
        self.peer_connections.close()  # any made meanwhile
        self.context.forward_connections.close()
        try:
            self._checkpoint_high_watermarks()
        except OSError as exc:
            logger.warning("node %d: could not write %s: %s", self.node_id, REPLICATION_OFFSET_CHECKPOINT, exc)
        self.store.close()

    def _checkpoint_high_watermarks(self) -> None:
        """Write every partition's high watermark when one changed since the last write."""
        current = {key: rep.hw for key, rep in self._replicas.items()}
        if current != self._hw_written:
            self._hw_checkpoint.update(current)  # type: ignore[arg-type]
            self._hw_written = current
        self._hw_written_at = time.monotonic()

    def _tick_loop(self) -> None:
        while not self._stop.wait(0.02):
            now = time.monotonic()
            if now - self._hw_written_at >= 1.0:
                try:
                    self._checkpoint_high_watermarks()
                except OSError as exc:
                    logger.warning("node %d: could not write %s: %s", self.node_id, REPLICATION_OFFSET_CHECKPOINT, exc)
                    self._hw_written_at = now
            for rep in self._replicas.values():
                self._elections.tick(rep, now)

    def _metadata_loop(self) -> None:
        """Apply the topic changes committed since (:meth:`ReplicatedMetadata.catch_up`), on a
        thread of their own: a large one (thousands of partitions, each with its files and its
        fetcher) must never hold up the tick's elections. Woken when ``__cluster_metadata-0``
        changes, and every 50 ms (a follower's high watermark moves without a wake-up)."""
        while not self._stop.is_set():
            self._metadata_moved.wait(0.05)
            self._metadata_moved.clear()
            try:
                self.metadata.catch_up()
            except Exception:  # noqa: BLE001 - whatever failed, the next change must still be applied
                logger.exception("node %d: could not apply %s", self.node_id, METADATA_TOPIC)
                self._stop.wait(1.0)

    def _partition_changed(self, rep: PartitionReplica) -> None:
        """Answer the delayed requests of ``rep`` that can be answered now (and wake the
        metadata's applier for ``__cluster_metadata-0``)."""
        if rep.topic == METADATA_TOPIC:
            self._metadata_moved.set()
        self.purgatory.check(rep.key)

    # ------------------------------------------------------------------ reading and reporting
    def read(self, topic: str, partition: int, offset: int, max_records: int | None = None) -> list[Record]:
        """Records of this replica from ``offset`` on, below its high watermark only: what a
        consumer may see (a follower's uncommitted tail may still be truncated). Thread-safe.

        Raises:
            ReplicationError: an unknown partition. OffsetOutOfRangeError: ``offset`` outside
            [log start, high watermark].
        """
        rep = self._replicas.get((topic, partition))
        if rep is None:
            raise ReplicationError(f"{topic}-{partition} is not replicated by node {self.node_id}",
                                   ErrorCode.unknown_topic_or_partition)
        with rep.cond:
            hw = min(rep.hw, rep.log.log_end_offset)
        if offset > hw:
            raise OffsetOutOfRangeError(offset, rep.log.log_start_offset, hw, f"read from {topic}-{partition}")
        return rep.log.read(offset, max_records=max_records, max_offset=hw)

    def describe(self) -> dict[tuple[str, int], dict[str, Any]]:
        """Per partition: role, leader, epoch, high watermark, log end, in-sync replicas.
        Thread-safe."""
        now = time.monotonic()
        out = {}
        for key, rep in self._replicas.items():
            with rep.cond:
                leader = rep.election.role is Role.LEADER
                isr = [self.node_id] + (self._leader.in_sync_followers(rep, now) if leader else [])
                out[key] = dict(role=rep.election.role.value, leader=rep.election.leader, epoch=rep.election.epoch,
                                high_watermark=rep.hw, log_end_offset=rep.log.log_end_offset,
                                in_sync=isr if leader else None)
        return out

    def metrics(self) -> dict[str, Any]:
        """The listener's metrics (:meth:`KafkaServer.metrics`: the store's, the network
        layer's connections and bytes, request counts and times per API) plus replication: how
        many partitions this node leads without every voter in sync (Kafka's
        UnderReplicatedPartitions), the largest follower lag in records (MaxLag) and each
        follower's lag by (topic, partition, follower). Thread-safe."""
        out = self.kafka.metrics()
        now = time.monotonic()
        lag: dict[tuple[str, int, int], int] = {}
        under = 0
        for (topic, partition), rep in self._replicas.items():
            with rep.cond:
                if rep.election.role is not Role.LEADER:
                    continue
                end = rep.log.log_end_offset
                for peer in self.peers:
                    lag[(topic, partition, peer)] = max(0, end - max(rep.leo.get(peer, 0), 0))
                in_sync = 1 + len(self._leader.in_sync_followers(rep, now))
                under += in_sync < len(self.peers) + 1
        out["kafka.server:type=ReplicaManager,name=UnderReplicatedPartitions"] = under
        out["kafka.server:type=ReplicaFetcherManager,name=MaxLag,clientId=Replica"] = max(lag.values(), default=0)
        out["logstore:type=Replica,name=FollowerLag"] = lag
        return out


class _ReplicaCredentials(CredentialsFile):
    """The listener's SASL users: the replica user (the shared secret) and Kafka clients' own
    (``users``: a credentials file, re-read when it changes, a mapping or a Credentials; None:
    none). A user of ``users`` named as the replica user is refused. Thread-safety: as
    CredentialsFile."""

    def __init__(self, password: str, users: Any, mechanisms: Any = None) -> None:  # no file of its own
        from .kafka.credentials import MECHANISMS
        self._replica = Credentials.from_mapping({REPLICA_USER: password}, ("SCRAM-SHA-256",))
        if isinstance(users, (str, os.PathLike)):
            users = CredentialsFile(users)
        elif users is not None and not isinstance(users, (Credentials, CredentialsFile)):
            users = Credentials.from_mapping(users, [m for m in (mechanisms or MECHANISMS) if m in MECHANISMS])
        self._users = users
        self._seen: Any = None
        self._merged = self._replica
        self.current()

    def current(self) -> Credentials:
        users = self._users.current() if isinstance(self._users, CredentialsFile) else self._users
        if users is not self._seen:
            entries = dict(users.entries()) if users is not None else {}
            if any(user == REPLICA_USER for user, _ in entries):
                if self._seen is None:  # at the start: refuse the configuration
                    raise ValueError(f"the user {REPLICA_USER!r} is the replica set's own: choose another name")
                logger.error("the credentials file names the user %r, the replica set's own: ignored", REPLICA_USER)
                entries = {key: value for key, value in entries.items() if key[0] != REPLICA_USER}
            entries.update(self._replica.entries())
            self._merged, self._seen = Credentials(entries), users
        return self._merged


def main(argv: list[str] | None = None, prog: str = "python -m logstore.replication") -> int:
    """Run one replica node until SIGTERM/SIGINT: ``logstore node --node-id 0 --data-dir DIR
    --listen 127.0.0.1:9000 --peer 1=127.0.0.1:9001 --peer 2=127.0.0.1:9002 --secret-file FILE
    [--cluster-id ID] [--topic NAME:PARTITIONS] [--tls-cert F --tls-key F --tls-ca F] [--advertised HOST:PORT]
    [--sasl-credentials FILE] [--sasl-oauthbearer NAME=VALUE ...] [--connections-max-reauth-ms MS]
    [--remote-storage URL [--remote-storage-option NAME=VALUE ...] [--remote-log-manager-task-interval-ms MS]]``. ``--listen`` is the node's one listener, Kafka's protocol, for
    Kafka clients and peers; ``--peer`` names the peers' listeners. Prints one "serving" line on
    stdout once it listens."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog=prog, description=main.__doc__)
    parser.add_argument("--node-id", type=int, required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--listen", required=True, help="host:port")
    parser.add_argument("--peer", action="append", default=[], help="id=host:port (repeat)")
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--cluster-id", help="the set's cluster id, the same on every node (22 characters of URL-safe "
                        "base64, as 'kafka-storage random-uuid' prints; kept in the data directory's meta.properties). "
                        "Default: the one the directory keeps, else one derived from the node ids (the same for every "
                        "set of the same ids)")
    parser.add_argument("--topic", action="append", default=[],
                        help="name:partitions (default replicated:1); the count when the topic is created: "
                             "CreatePartitions grows it, and its count then wins over the one here")
    parser.add_argument("--election-timeout-ms", type=int, default=1000)
    parser.add_argument("--min-insync-replicas", type=int, default=2)
    parser.add_argument("--log-level", default="WARNING", help="logging level for the node (INFO shows elections)")
    parser.add_argument("--tls-cert", help="PEM certificate of this node (with --tls-key and --tls-ca: mutual TLS)")
    parser.add_argument("--tls-key", help="PEM private key of this node")
    parser.add_argument("--tls-ca", help="PEM CA certificate(s) that peers' and clients' certificates must chain to")
    parser.add_argument("--max-connections", type=int, default=256)
    parser.add_argument("--connections-max-idle-ms", type=int, default=600_000)
    parser.add_argument("--advertised", help="host:port that Metadata names for this node (default: the bound one)")
    parser.add_argument("--advertised-peer", action="append", default=[],
                        help="id=host:port: what Metadata names for a peer (default: its --peer)")
    parser.add_argument("--remote-storage", metavar="URL",
                        help="tiered storage (KIP-405): the object store the whole set shares (file:///path, "
                             "s3://bucket/prefix, gs://..., az://...), the same on every node; topics with "
                             "remote.storage.enable copy their sealed segments there (default: the one the data "
                             "directory remembers, if any)")
    parser.add_argument("--remote-storage-option", action="append", default=[], metavar="NAME=VALUE",
                        help="an object store setting (obstore's names: endpoint, region, allow_http, ...); repeat")
    parser.add_argument("--remote-log-manager-task-interval-ms", type=int, default=30_000, metavar="MS",
                        help="Kafka's remote.log.manager.task.interval.ms: how often the tiered partitions' copies, "
                             "expirations and local retention run (default 30000)")
    add_sasl_arguments(parser)  # Kafka clients' SASL; the replica user logs in with the secret (SCRAM-SHA-256)
    add_authorizer_arguments(parser)
    add_transaction_arguments(parser)
    add_consumer_group_arguments(parser)
    args = parser.parse_args(argv)
    tls_files = (args.tls_cert, args.tls_key, args.tls_ca)
    if any(tls_files) and not all(tls_files):
        parser.error("--tls-cert, --tls-key and --tls-ca go together")
    logging.basicConfig(level=args.log_level.upper(), format=f"%(asctime)s node {args.node_id} %(name)s %(message)s")

    def address(text: str) -> tuple[str, int]:
        host, _, port = text.rpartition(":")
        if not host or not port.isdigit():
            parser.error(f"expected host:port, got {text!r}")
        return host, int(port)

    def id_addresses(items: list[str]) -> dict[int, tuple[str, int]]:
        out = {}
        for item in items:
            node, _, addr = item.partition("=")
            if not node.isdigit():
                parser.error(f"expected id=host:port, got {item!r}")
            out[int(node)] = address(addr)
        return out

    peers = id_addresses(args.peer)
    try:
        remote_options = parse_options(args.remote_storage_option)
    except ValueError as exc:
        parser.error(str(exc))
    topics = []
    for item in args.topic or ["replicated:1"]:
        name, _, count = item.partition(":")
        topics.append((name, int(count or 1)))
    try:
        with open(args.secret_file, "rb") as f:
            secret = f.read().strip()
    except OSError as exc:
        parser.error(f"cannot read the secret file: {exc}")
    try:
        options: dict[str, Any] = {"txn_config": transaction_config(args), **sasl_options(args),
                                   **authorizer_options(args), "consumer_group_config": consumer_group_config(args)}
        node = ReplicaNode(args.node_id, args.data_dir, address(args.listen), peers, secret, partitions=topics,
                           election_timeout_ms=args.election_timeout_ms,
                           min_insync_replicas=args.min_insync_replicas,
                           tls=TLSConfig(*tls_files) if all(tls_files) else None,
                           max_connections=args.max_connections,
                           connections_max_idle_ms=args.connections_max_idle_ms,
                           advertised=address(args.advertised) if args.advertised else None,
                           advertised_peers=id_addresses(args.advertised_peer) if args.advertised_peer else None,
                           cluster_id=args.cluster_id, kafka_options=options, remote_storage=args.remote_storage,
                           remote_storage_options=remote_options or None,
                           remote_log_manager_task_interval_ms=args.remote_log_manager_task_interval_ms).start()
    except (ValueError, OSError, LogstoreError) as exc:
        parser.error(str(exc))
    import faulthandler

    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid> prints every thread's stack
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    net.freeze_startup_heap()
    print(f"node {args.node_id} serving on {node.address[0]}:{node.address[1]} ({node.kafka.security_protocol})",
          flush=True)
    done.wait()
    node.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
