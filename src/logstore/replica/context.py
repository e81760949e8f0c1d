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
import hashlib
import ssl
import threading
import uuid

from ..net.purgatory import Purgatory
from .client import NodeConnection, PeerConnections
from .partition import PartitionReplica

__all__ = ["NodeContext", "cluster_id_of", "replica_topic_id"]


def cluster_id_of(secret: bytes, voters: list[int]) -> str:
    """The replica set's cluster id: one for every node (clients check that brokers agree on
    it), derived from the set's secret and its voters, so no node has to tell the others."""
    digest = hashlib.sha256(secret + repr(sorted(voters)).encode()).digest()
    return base64.urlsafe_b64encode(digest[:16]).decode().rstrip("=")


def replica_topic_id(cluster_id: str, topic: str) -> uuid.UUID:
    """The topic id (KIP-516) every node of a replica set gives ``topic``.

    Each node creates a replica set's topics in its own store (those it starts with, and those
    CreateTopics made, from the replicated metadata); there is no controller to hand out ids.
    So each node derives it from what all the nodes share, the cluster id, and the topic's
    name: the nodes agree without a message, and another replica set (another cluster id)
    gives the same name another id, as Kafka clients expect of another cluster. A topic of a
    replica set is never deleted and created again (DeleteTopics is refused), so one name has
    one id for the set's life. As Kafka's ``Uuid.randomUuid``, the id is never 0, 1 or one
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
        election_timeout_s: the base election timeout.
        replica_lag_s: a follower is in sync while it reached the leader's end this recently.
        fetch_wait_s: how long a caught-up follower's fetch waits at the leader.
        min_insync: acks=all needs this many in-sync replicas (leader included).
        fetch_max_bytes: the most batch bytes one follower fetch answer carries.
        client_tls: the TLS context of connections to peers (None: plaintext).
        purgatory: the node's delayed requests (held fetches, acks=all produces), by partition.

    The settings are plain attributes that the parts read at each use, so a change (say of
    ``min_insync``) takes effect at the next request. ``voters`` (the peers and this node) and
    ``cluster_id`` (one for every node of the set: clients check that brokers agree on it, and
    peers' requests carry it) follow from the identity.

    Thread-safety: the partitions are added before the node starts, or later (a
    CreatePartitions) into a new table; each :class:`PartitionReplica` is changed under its
    own ``cond``; ``stopping``, ``peer_connections`` and ``purgatory`` are thread-safe.
    """

    def __init__(self, node_id: int, peers: dict[int, tuple[str, int]], secret: bytes, *,
                 election_timeout_s: float, replica_lag_s: float, fetch_wait_s: float, min_insync: int,
                 fetch_max_bytes: int, client_tls: ssl.SSLContext | None, purgatory: Purgatory) -> None:
        self.node_id = node_id
        self.peers = dict(peers)
        self.voters = sorted(set(self.peers) | {node_id})
        self.secret = secret
        self.cluster_id = cluster_id_of(secret, self.voters)
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
