"""What the parts of one replica node share: :class:`NodeContext`.

A replica node (:class:`~logstore.replication.ReplicaNode`) is made of parts that each own one
job: the election driver (:mod:`~logstore.replica.elections`: timers, campaigns, votes), the
leader's side (:mod:`~logstore.replica.leader`: epochs, followers' fetches, the high watermark),
the follower's fetchers (:mod:`~logstore.replica.follower`) and the listener's answers
(:mod:`~logstore.replica.peerapis`, :mod:`~logstore.replica.kafkaapis`). What all of them read
and none of them owns is the node's context, which the node builds and hands to each part: the
node's identity and its peers, the replication settings, the replicated partitions, the stop
flag, the connections to the peers and the purgatory where delayed requests wait. Where one
part acts on another (a won election makes the leader's side take up the epoch; a fetcher that
heard from its leader pushes the election timer back) it calls that part, which it was given
when the node built it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import ssl
import threading
import uuid

from ..net.purgatory import Purgatory
from .client import NodeConnection, PeerConnections
from .partition import PartitionReplica

__all__ = ["NodeContext", "random_cluster_id", "check_cluster_id", "default_cluster_id", "replica_topic_id"]


def random_cluster_id() -> str:
    """A new cluster id, as ``kafka-storage random-uuid`` prints one: 16 random bytes in
    URL-safe base64 without padding (22 characters), never starting with ``-``."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


_CLUSTER_ID = re.compile(r"[A-Za-z0-9_-]{22}")


def check_cluster_id(cluster_id: str) -> str:
    """``cluster_id`` if it is one of Kafka's (16 bytes in URL-safe base64, 22 characters, as
    ``kafka-storage format --cluster-id`` takes it).

    Raises:
        ValueError: it is not."""
    raw = b""
    if _CLUSTER_ID.fullmatch(cluster_id):  # (urlsafe_b64decode also takes "+" and "/")
        try:
            raw = base64.urlsafe_b64decode(cluster_id + "==")
        except (binascii.Error, ValueError):
            pass
    if len(raw) != 16:
        raise ValueError(f"{cluster_id!r} is not a cluster id (22 characters of URL-safe base64, as "
                         "'kafka-storage random-uuid' prints)")
    return cluster_id


def default_cluster_id(voters: list[int]) -> str:
    """The cluster id of a replica set none was given to (``--cluster-id``), as its nodes take
    it at their first start and keep it in ``meta.properties``: derived from the voters' ids
    alone, so that every node takes the same without a message, and it says nothing of the
    secret. Every set of the same node ids takes the same one: give each set its own
    (:func:`random_cluster_id`) where sets may meet, as Kafka's ``kafka-storage format``
    asks. Pure."""
    digest = hashlib.sha256(f"logstore-cluster-id\0{sorted(voters)!r}".encode()).digest()
    text = base64.urlsafe_b64encode(digest[:16]).decode().rstrip("=")
    return text if not text.startswith("-") else "A" + text[1:]


def replica_topic_id(cluster_id: str, topic: str) -> uuid.UUID:
    """The topic id (KIP-516) every node of a replica set gives ``topic`` when it creates it.

    Each node creates a replica set's topics in its own store (those it starts with, and those
    CreateTopics made, from the replicated metadata); there is no controller to hand out ids.
    So each node derives it from what all the nodes share, the cluster id, and the topic's
    name: the nodes agree without a message, and another replica set (another cluster id)
    gives the same name another id, as Kafka clients expect of another cluster. A topic of a
    replica set is never deleted and created again (DeleteTopics is refused), so one name has
    one id for the set's life. The id is kept in the topic's file from its creation on: a set
    whose cluster id was once derived otherwise (from its secret, before cluster ids were
    chosen) keeps its topics' ids. As Kafka's ``Uuid.randomUuid``, the id is never 0, 1 or one
    whose text starts with ``-``: the hash is taken again with a counter until it is not.
    """
    counter = 0
    while True:
        digest = hashlib.sha256(f"logstore-topic-id\0{cluster_id}\0{topic}\0{counter}".encode()).digest()
        candidate = uuid.UUID(bytes=digest[:16])
        if candidate.int > 1 and not base64.urlsafe_b64encode(candidate.bytes).startswith(b"-"):
            return candidate
        counter += 1


class NodeContext:
    """One replica node's identity, settings and shared state, as its parts see them.

    Args:
        node_id: this node's id, unique in the set.
        peers: {node id: (host, port)}: the other voters' listeners.
        secret: the set's shared secret (the replica user's SASL password).
        cluster_id: the set's cluster id (chosen once, kept in each node's ``meta.properties``;
            None: :func:`default_cluster_id` of the voters).
        election_timeout_s: the base election timeout.
        replica_lag_s: a follower is in sync while it reached the leader's end this recently.
        fetch_wait_s: how long a caught-up follower's fetch waits at the leader.
        min_insync: acks=all needs this many in-sync replicas (leader included).
        fetch_max_bytes: the most batch bytes one follower fetch answer carries.
        client_tls: the TLS context of connections to peers (None: plaintext).
        purgatory: the node's delayed requests (held fetches, acks=all produces), by partition.

    The settings are plain attributes that the parts read at each use, so a change (say of
    ``min_insync``) takes effect at the next request. ``voters`` (the peers and this node)
    follow from the identity; ``cluster_id`` is one for every node of the set (clients check
    that brokers agree on it, and peers' requests carry it: a node of another cluster is
    refused with INCONSISTENT_CLUSTER_ID).

    Thread-safety: the partitions are added before the node starts, or later (a
    CreatePartitions) into a new table; each :class:`PartitionReplica` is changed under its
    own ``cond``; ``stopping``, ``peer_connections``, ``forward_connections`` and ``purgatory``
    are thread-safe.
    """

    def __init__(self, node_id: int, peers: dict[int, tuple[str, int]], secret: bytes, *,
                 cluster_id: str | None = None, election_timeout_s: float, replica_lag_s: float, fetch_wait_s: float, min_insync: int,
                 fetch_max_bytes: int, client_tls: ssl.SSLContext | None, purgatory: Purgatory) -> None:
        self.node_id = node_id
        self.peers = dict(peers)
        self.voters = sorted(set(self.peers) | {node_id})
        self.secret = secret
        self.cluster_id = cluster_id if cluster_id is not None else default_cluster_id(self.voters)
        self.election_timeout_s = election_timeout_s
        self.replica_lag_s = replica_lag_s
        self.fetch_wait_s = fetch_wait_s
        self.min_insync = min_insync
        self.fetch_max_bytes = fetch_max_bytes
        self.purgatory = purgatory
        #: set once when the node stops: every part's loop and wait ends at it
        self.stopping = threading.Event()
        #: (topic, partition) -> the replicated partition
        self.replicas: dict[tuple[str, int], PartitionReplica] = {}
        self._client_tls = client_tls
        #: the connections for votes, BeginQuorumEpoch and leader discovery (one per peer)
        self.peer_connections = PeerConnections(self.peers, secret, node_id, client_tls, self.stopping)
        #: the connections for the Envelopes this node forwards (topic and ACL changes, which
        #: wait for a majority): never the elections' ones, which must not wait behind them
        self.forward_connections = PeerConnections(self.peers, secret, node_id, client_tls, self.stopping)

    def add_replica(self, rep: PartitionReplica) -> None:
        """Replicate ``rep``'s partition (before the node starts, or while it runs: a new
        table replaces ``replicas``, so that a thread iterating the old one is not disturbed)."""
        self.replicas = {**self.replicas, rep.key: rep}

    def replica(self, topic: str, partition: int) -> PartitionReplica | None:
        """The replicated partition ``topic``-``partition``, or None when this node does not
        replicate it."""
        return self.replicas.get((topic, partition))

    def new_peer_connections(self) -> PeerConnections:
        """A set of connections to the peers of its own (as ``peer_connections``), for requests
        that must not wait behind votes or delay them; the caller closes it."""
        return PeerConnections(self.peers, self.secret, self.node_id, self._client_tls, self.stopping)

    def connect(self, peer: int, timeout: float) -> NodeConnection:
        """A new connection to ``peer``'s listener, logged in as the replica user (over TLS when
        the node has it); the caller owns and closes it.

        Raises:
            KafkaClientError: the peer could not be reached or refused the login.
        """
        return NodeConnection(self.peers[peer], self.secret, self.node_id, timeout, self._client_tls)
