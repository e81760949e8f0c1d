"""Replication: leader/follower replica sets over TCP (work in progress, see issue 5).

Each replicated partition is its own Raft group (KIP-595's rules, election.py): its replicas
elect a leader per epoch; the leader stamps its epoch into every batch it appends; followers
fetch from the leader with (fetch offset, last fetched epoch) and either get batches (copied byte
for byte), or a diverging (epoch, end offset) that makes them truncate (KIP-101/KIP-279); the
high watermark is the offset held by a majority and only advances over records of the leader's
own epoch. acks=all waits for the high watermark; a leader that a higher epoch deposed can never
advance it again, so it can never acknowledge.
"""

from __future__ import annotations

import logging
import random
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

from . import compression
from .checkpoint import REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpoints
from .election import NONE, Election, QuorumStateFile, Role
from .errors import CorruptRecordError, InvalidRecordError, LogstoreError, OffsetOutOfRangeError, RecordTooLargeError
from .records import BatchBuilder, Record, batch_headers, decode_batches, leader_change_record, parse_header, validate_client_batch
from .store import LogStore
from .wire import (
    DEFAULT_MAX_FRAME,
    FrameError,
    Reader,
    RequestType,
    TLSConfig,
    Writer,
    client_handshake,
    recv_frame,
    send_frame,
    server_handshake,
)

__all__ = ["ReplicaNode", "Client", "Fetched", "TLSConfig", "NotLeaderError", "NotEnoughReplicasError",
           "ReplicationTimeoutError", "ReplicationError"]

logger = logging.getLogger("logstore.replication")

OK = 0
NOT_LEADER = 1
NOT_ENOUGH_REPLICAS = 2
FENCED_EPOCH = 3
TIMEOUT = 4
UNKNOWN_PARTITION = 5
OUT_OF_RANGE = 6
INVALID = 7
CORRUPT_BATCH = 8
RECORD_TOO_LARGE = 9
INVALID_RECORD = 10
_ERRORS = {NOT_LEADER: "not the leader", NOT_ENOUGH_REPLICAS: "not enough in-sync replicas",
           FENCED_EPOCH: "fenced epoch", TIMEOUT: "timed out", UNKNOWN_PARTITION: "unknown partition",
           OUT_OF_RANGE: "offset out of range", INVALID: "invalid request",
           CORRUPT_BATCH: "corrupt record batch", RECORD_TOO_LARGE: "batch larger than max_message_bytes",
           INVALID_RECORD: "a record the partition does not accept"}


class ReplicationError(LogstoreError):
    """A replication request failed (the message says why)."""

    def __init__(self, message: str, code: int = INVALID, leader: int = NONE) -> None:
        super().__init__(message)
        self.code = code
        self.leader = leader


class NotLeaderError(ReplicationError):
    """The node asked is not the partition's leader; ``leader`` names the one it knows (or -1)."""


class NotEnoughReplicasError(ReplicationError):
    """Fewer than min_insync_replicas replicas are in sync; nothing was written (acks="all")."""


class ReplicationTimeoutError(ReplicationError):
    """The leader appended the records but a majority did not confirm them within the timeout
    (acks="all"): they may still be committed later, or lost with the leader. (The retries
    ``produce`` makes itself carry the same producer sequence and are never appended twice; a
    new ``produce`` call is a new write.)"""


def _raise_for(code: int, leader: int, what: str) -> None:
    if code == OK:
        return
    text = f"{what}: {_ERRORS.get(code, f'error {code}')}"
    if code == NOT_LEADER:
        raise NotLeaderError(text + (f" (leader: node {leader})" if leader != NONE else ""), code, leader)
    if code == NOT_ENOUGH_REPLICAS:
        raise NotEnoughReplicasError(text, code, leader)
    if code == TIMEOUT:
        raise ReplicationTimeoutError(text, code, leader)
    raise ReplicationError(text, code, leader)


# ---------------------------------------------------------------------- connections
class _Connection:
    """One authenticated client connection to a peer (request/response, one at a time)."""

    def __init__(self, address: tuple[str, int], secret: bytes, node_id: int, timeout: float,
                 max_frame: int, tls: ssl.SSLContext | None = None) -> None:
        sock = socket.create_connection(address, timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = tls.wrap_socket(sock)
            client_handshake(sock, secret, node_id)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.max_frame = max_frame
        self._next = 1
        #: one request at a time on this connection (several threads of a node share it)
        self.lock = threading.Lock()

    def request(self, type: int, payload: bytes, timeout: float | None = None) -> Reader:
        cid = self._next
        self._next += 1
        if timeout is not None:
            self.sock.settimeout(timeout)
        send_frame(self.sock, type, cid, payload)
        frame = recv_frame(self.sock, self.max_frame)
        if frame.correlation_id != cid:
            raise FrameError(f"response {frame.correlation_id} to request {cid}")
        return frame.reader()

    def close(self) -> None:
        """Close every connection."""
        try:
            self.sock.close()
        except OSError:
            pass


# ---------------------------------------------------------------------- partition state
@dataclass
class _Replica:
    topic: str
    partition: int
    log: Any
    election: Election
    deadline: float = 0.0
    hw: int = 0
    leo: dict[int, int] = field(default_factory=dict)            # follower -> log end offset
    contact: dict[int, float] = field(default_factory=dict)      # follower -> last fetch (monotonic)
    caught_up: dict[int, float] = field(default_factory=dict)    # follower -> last time at leader's LEO
    epoch_start: int = 0
    #: when a leader last answered this follower (monotonic), and whether its connection to
    #: the leader was refused or dropped since: a pre-vote is granted only without a live leader
    leader_seen: float = 0.0
    leader_lost: bool = False
    #: producer id -> (base sequence, first offset, last offset) of its last batch: a retried
    #: produce (same id and sequence) is answered with the offsets it already has.
    producers: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)


class ReplicaNode:
    """A process serving a LogStore's partitions as one replica of a set of 2f+1 nodes.

    Args:
        node_id: this node's id (an int >= 0), unique in the set.
        data_dir: its LogStore root.
        listen: (host, port) to serve on (loopback unless told otherwise).
        peers: {node id: (host, port)} of the other replicas.
        secret: the shared secret (bytes) peers and clients authenticate with.
        partitions: [(topic, partitions)] to replicate (created when missing).
        election_timeout_ms: base election timeout (randomised up to twice it).
        replica_lag_time_max_ms: a follower is in sync while it reached the leader's end this
            recently.
        replica_fetch_wait_max_ms: how long the leader holds a caught-up follower's fetch
            waiting for new records (at most half the election timeout).
        min_insync_replicas: acks="all" needs this many in-sync replicas (leader included).
        fetch_max_bytes: the most batch bytes one fetch answer carries (at least one batch).
        max_frame: the largest frame accepted from an authenticated peer.
        tls: mutual TLS for every connection, served and made (None: plain TCP).
        max_connections: connections served at once; more are closed as they arrive.
        connections_max_idle_ms: a served connection that sends no request for this long is
            closed (Kafka's name); the handshake must finish within ``handshake_timeout_ms``.

    Durability: records are appended with the store's flush policy (page cache by default);
    acks="all" means held by a majority, not fsynced by one. Thread-safety: start() and stop()
    from one thread; every other method may be called from any thread.
    """

    def __init__(self, node_id: int, data_dir: str, listen: tuple[str, int] = ("127.0.0.1", 0),
                 peers: dict[int, tuple[str, int]] | None = None, secret: bytes = b"", *,
                 partitions: Iterable[tuple[str, int]] = (("replicated", 1),),
                 election_timeout_ms: int = 1000, replica_lag_time_max_ms: int = 10_000,
                 replica_fetch_wait_max_ms: int = 500,
                 min_insync_replicas: int = 2, fetch_max_bytes: int = 1 << 20, max_frame: int = DEFAULT_MAX_FRAME,
                 tls: TLSConfig | None = None, max_connections: int = 256,
                 connections_max_idle_ms: int = 600_000, handshake_timeout_ms: int = 10_000) -> None:
        if not secret:
            raise ValueError("a shared secret is required")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if connections_max_idle_ms <= 0 or handshake_timeout_ms <= 0:
            raise ValueError("connections_max_idle_ms and handshake_timeout_ms must be > 0")
        self.node_id = node_id
        self.peers = dict(peers or {})
        self.voters = sorted(set(self.peers) | {node_id})
        self.secret = secret
        self.election_timeout_s = election_timeout_ms / 1000.0
        self.replica_lag_s = replica_lag_time_max_ms / 1000.0
        self.fetch_wait_s = max(0.0, min(replica_fetch_wait_max_ms / 1000.0, self.election_timeout_s / 2))
        self.min_insync = min_insync_replicas
        self.fetch_max_bytes = fetch_max_bytes
        self.max_frame = max_frame
        self.max_connections = max_connections
        self.idle_s = connections_max_idle_ms / 1000.0
        self.handshake_s = handshake_timeout_ms / 1000.0
        self._server_tls = tls.server_context() if tls is not None else None
        self._client_tls = tls.client_context() if tls is not None else None
        self.store = LogStore(data_dir, shared=False, maintenance=False)
        self._replicas: dict[tuple[str, int], _Replica] = {}
        # The high watermark each partition had (Kafka's replication-offset-checkpoint): a
        # restarted replica must not take its uncommitted tail for committed. It is written
        # every second and at stop, so it may lag; a lower bound is safe (the leader's fetch
        # answers bring it up to date).
        self._hw_checkpoint = OffsetCheckpoints(data_dir, REPLICATION_OFFSET_CHECKPOINT)
        self._hw_written: dict[tuple[str, int], int] = self._hw_checkpoint.read()
        self._hw_written_at = time.monotonic()
        for topic, count in partitions:
            self.store.create_topic(topic, count, exist_ok=True)
            for p in range(count):
                log = self.store.partition(topic, p)
                election = Election(node_id, self.voters, QuorumStateFile(log.path, self.voters))
                saved = self._hw_written.get((topic, p), log.log_start_offset)
                hw = max(log.log_start_offset, min(saved, log.log_end_offset))
                log.high_watermark = hw
                self._replicas[(topic, p)] = replica = _Replica(topic, p, log, election, hw=hw)
                self._load_producers(replica)
        self._listener = socket.create_server(listen)
        self.address = self._listener.getsockname()[:2]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.RLock()
        self._conns: dict[int, _Connection] = {}
        self._fetch_conns: dict[tuple[str, int], _Connection] = {}
        self._served: set[socket.socket] = set()
        self._rng = random.Random()

    # ------------------------------------------------------------------ life cycle
    def start(self) -> "ReplicaNode":
        """Start serving, electing and replicating (background threads); returns self."""
        now = time.monotonic()
        for r in self._replicas.values():
            r.deadline = now + Election.election_timeout(self.election_timeout_s, self._rng)
            if r.election.leader != NONE and r.election.leader != self.node_id:
                r.log.high_watermark = min(r.hw, r.log.log_end_offset)
        targets: list[tuple[Any, tuple[Any, ...], str]] = [
            (self._accept_loop, (), "accept"), (self._tick_loop, (), "tick")]
        # One fetcher per partition, each on its own connection, so that a long-polling fetch
        # of one partition never holds up another's.
        targets += [(self._fetch_loop, (r,), f"fetch-{r.topic}-{r.partition}") for r in self._replicas.values()]
        for target, args, name in targets:
            t = threading.Thread(target=target, args=args, name=f"replica-{self.node_id}-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        """Stop every thread, close connections and the store. Not resumable."""
        self._stop.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            outgoing = list(self._conns)
            fetchers = list(self._fetch_conns.values())
        for peer in outgoing:  # requests blocked on a peer fail at once
            self._drop(peer)
        for conn in fetchers:
            conn.close()
        with self._lock:
            served = list(self._served)
        for sock in served:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for r in self._replicas.values():
            with r.cond:
                r.cond.notify_all()
        for t in self._threads:
            t.join(5)
        for conn in list(self._conns.values()):
            conn.close()
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

    # ------------------------------------------------------------------ server
    def _accept_loop(self) -> None:
        self._listener.settimeout(0.1)  # close() does not wake a blocked accept(): poll the stop flag
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                full = len(self._served) >= self.max_connections
                if not full:
                    self._served.add(sock)
            if full:
                logger.warning("node %d: refusing a connection: %d connections open (max_connections)",
                               self.node_id, self.max_connections)
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        raw = sock
        try:
            started = time.monotonic()
            sock.settimeout(self.handshake_s)
            if self._server_tls is not None:
                sock = self._server_tls.wrap_socket(sock, server_side=True)
                with self._lock:
                    self._served.discard(raw)
                    self._served.add(sock)
            # One deadline for the whole handshake (TLS included): a peer dribbling a byte at a
            # time cannot hold a connection slot for longer.
            server_handshake(sock, self.secret, max(0.001, self.handshake_s - (time.monotonic() - started)))
            sock.settimeout(self.idle_s)  # waiting for the next request; a handler may take longer
            while not self._stop.is_set():
                try:
                    frame = recv_frame(sock, self.max_frame)
                except socket.timeout:
                    logger.debug("node %d: closing a connection idle for %.0f s", self.node_id, self.idle_s)
                    return
                handler = {RequestType.FETCH: self._on_fetch, RequestType.PRODUCE: self._on_produce,
                           RequestType.VOTE: self._on_vote, RequestType.BEGIN_EPOCH: self._on_begin_epoch,
                           RequestType.METADATA: self._on_metadata}.get(frame.type)  # type: ignore[call-overload]
                if handler is None:
                    send_frame(sock, RequestType.ERROR, frame.correlation_id,
                               Writer().string(f"unknown request type {frame.type}").payload())
                    continue
                send_frame(sock, frame.type, frame.correlation_id, handler(frame.reader()))
        except (OSError, ConnectionError, LogstoreError) as exc:
            logger.debug("node %d: connection ended: %s", self.node_id, exc)
        finally:
            with self._lock:
                self._served.discard(sock)
                self._served.discard(raw)
            sock.close()

    def _replica(self, r: Reader) -> _Replica | None:
        topic = r.string("topic")
        partition = r.int32("partition")
        return self._replicas.get((topic, partition))

    # ------------------------------------------------------------------ elections
    def _on_vote(self, r: Reader) -> bytes:
        rep = self._replica(r)
        epoch, candidate, last_epoch, end = r.int32(), r.int32(), r.int32(), r.int64()
        pre_vote = r.int8("pre-vote flag") == 1
        r.end()
        if rep is None:
            return Writer().int32(-1).int8(0).payload()
        if pre_vote:
            with rep.cond:
                election = rep.election
                alive = election.role is Role.LEADER or (
                    election.leader != NONE and not rep.leader_lost
                    and time.monotonic() - rep.leader_seen < self.election_timeout_s)
                granted = not alive and election.would_grant_pre_vote(
                    epoch, candidate, last_epoch, end, rep.log.latest_epoch, rep.log.log_end_offset)
                return Writer().int32(election.epoch).int8(1 if granted else 0).payload()
        with rep.cond:
            was_leader = rep.election.role is Role.LEADER
            granted, now_epoch = rep.election.on_vote_request(epoch, candidate, last_epoch, end,
                                                              rep.log.latest_epoch, rep.log.log_end_offset)
            if was_leader and rep.election.role is not Role.LEADER:
                rep.cond.notify_all()
            if granted:
                rep.deadline = time.monotonic() + Election.election_timeout(self.election_timeout_s, self._rng)
        return Writer().int32(now_epoch).int8(1 if granted else 0).payload()

    def _campaign(self, rep: _Replica) -> None:
        """Start an election if the deadline is still due (a vote granted or a leader heard from
        meanwhile pushes it back: the check and the campaign's start are one step under the
        partition's lock), then ask every peer at once, so that a dead peer delays nothing."""
        with rep.cond:
            now = time.monotonic()
            if now < rep.deadline or rep.election.role is Role.LEADER:
                return
            rep.deadline = token = now + Election.election_timeout(self.election_timeout_s, self._rng)
            base_epoch = rep.election.epoch
        if len(self.voters) > 1 and not self._pre_vote(rep, base_epoch + 1):
            return
        with rep.cond:
            # Still due? A vote granted or a leader heard from meanwhile moved the deadline.
            if rep.deadline != token or rep.election.epoch != base_epoch or rep.election.role is Role.LEADER:
                return
            state = rep.election.start_campaign()
            if rep.election.role is Role.LEADER:  # a single-voter set
                self._lead_or_step_down(rep)
                return
            last_epoch, end = rep.log.latest_epoch, rep.log.log_end_offset
        payload = (Writer().string(rep.topic).int32(rep.partition).int32(state.epoch).int32(self.node_id)
                   .int32(last_epoch).int64(end).int8(0).payload())
        won = threading.Event()

        def ask(peer: int) -> None:
            try:
                resp = self._request(peer, RequestType.VOTE, payload, timeout=self.election_timeout_s / 2)
                epoch, granted = resp.int32(), resp.int8()
            except (OSError, LogstoreError):
                return
            try:
                with rep.cond:
                    if rep.election.epoch == state.epoch and rep.election.on_vote_response(epoch, peer, bool(granted)):
                        self._lead_or_step_down(rep)
                        if rep.election.role is Role.LEADER:
                            won.set()
                    elif epoch > state.epoch:
                        rep.election.observe_epoch(epoch)
            except Exception:  # noqa: BLE001 - a vote thread must not die silently
                logger.exception("node %d: %s-%d: counting the vote of %d failed", self.node_id,
                                 rep.topic, rep.partition, peer)

        self._each_peer_at_once(ask)
        if won.is_set():
            self._announce(rep)

    def _pre_vote(self, rep: _Replica, epoch: int) -> bool:
        """Ask every peer at once whether it would vote for this node in ``epoch`` (nothing is
        persisted by anyone). Only with a majority does the real campaign start, so a node that
        was cut off, or restarted, cannot depose a leader the others still hear from."""
        with rep.cond:
            last_epoch, end = rep.log.latest_epoch, rep.log.log_end_offset
        payload = (Writer().string(rep.topic).int32(rep.partition).int32(epoch).int32(self.node_id)
                   .int32(last_epoch).int64(end).int8(1).payload())
        grants = [self.node_id]
        lock = threading.Lock()

        def ask(peer: int) -> None:
            try:
                resp = self._request(peer, RequestType.VOTE, payload, timeout=self.election_timeout_s / 2)
                their_epoch, granted = resp.int32(), resp.int8()
            except (OSError, LogstoreError):
                return
            if granted:
                with lock:
                    grants.append(peer)
            elif their_epoch >= epoch:
                with rep.cond:
                    rep.election.observe_epoch(their_epoch)

        self._each_peer_at_once(ask)
        if len(grants) < rep.election.majority:
            logger.debug("node %d: pre-vote for %s-%d epoch %d: %d of %d", self.node_id, rep.topic,
                         rep.partition, epoch, len(grants), len(self.voters))
            return False
        return True

    @staticmethod
    def _note_producers(rep: _Replica, data: bytes) -> None:
        """Record the producer (id, sequence) of each batch in ``data`` (whole batches)."""
        for _, h in batch_headers(data):
            if h.producer_id >= 0 and h.base_sequence >= 0:
                rep.producers[h.producer_id] = (h.base_sequence, h.base_offset, h.last_offset)

    @staticmethod
    def _forget_producers_from(rep: _Replica, offset: int) -> None:
        """The log was truncated to ``offset``: a producer whose last batch is gone gets its
        retry appended again (only the latest produce of a client is ever retried)."""
        rep.producers = {pid: v for pid, v in rep.producers.items() if v[2] < offset}

    def _load_producers(self, rep: _Replica) -> None:
        """Rebuild the table of each producer's last batch from the batch headers (at start;
        from then on appends and truncations keep it, so an election never scans the log)."""
        log = rep.log
        rep.producers = {}
        offset = log.log_start_offset
        end = log.log_end_offset
        while offset < end:
            data = log.read_raw(offset, 1 << 20)
            if not data:
                break
            self._note_producers(rep, data)
            offset = _end_of(data, offset)

    def _lead_or_step_down(self, rep: _Replica) -> None:
        """Set up leadership of the epoch just won; if that fails (a full disk when writing
        the epoch checkpoint or the leader change record), give the epoch up at once rather
        than lead without an epoch stamp and a record of its own (caller holds rep.cond)."""
        try:
            self._become_leader(rep)
        except Exception:
            logger.exception("node %d: could not take up leadership of %s-%d in epoch %d; stepping down",
                             self.node_id, rep.topic, rep.partition, rep.election.epoch)
            rep.election.step_down()
            rep.deadline = time.monotonic() + Election.election_timeout(self.election_timeout_s, self._rng)
            rep.cond.notify_all()

    def _become_leader(self, rep: _Replica) -> None:
        epoch = rep.election.epoch
        rep.log.assign_leader_epoch(epoch)
        rep.epoch_start = rep.log.log_end_offset
        # A record of the new epoch, as KRaft's leader writes at once: the high watermark only
        # counts records of the leader's own epoch (counting older ones by their replicas is
        # unsafe, Raft §5.4.2), so without it records of earlier epochs would stay uncommitted
        # until the next produce, and a retried produce of such a record would wait forever.
        # What followers hold is learnt afresh in this epoch: their offsets from the previous one
        # must not count towards the high watermark.
        rep.leo = {}
        now = time.monotonic()
        rep.contact = {p: now for p in self.peers}
        # Every replica starts in sync (as Kafka's new leader keeps the ISR it inherits); one
        # that does not catch up within replica_lag_time_max_ms drops out.
        rep.caught_up = {p: now for p in self.peers}
        key, value = leader_change_record(self.node_id, self.voters, rep.election.granted_by)
        rep.log.append_batch([value], [key], control=True)
        self._advance_hw(rep)  # a set of one commits at once
        logger.info("node %d leads %s-%d in epoch %d", self.node_id, rep.topic, rep.partition, epoch)

    def _announce(self, rep: _Replica) -> None:
        """Tell every peer at once (a dead peer delays nothing) that this node leads the epoch."""
        payload = Writer().string(rep.topic).int32(rep.partition).int32(rep.election.epoch).int32(self.node_id).payload()

        def tell(peer: int) -> None:
            try:
                self._request(peer, RequestType.BEGIN_EPOCH, payload, timeout=self.election_timeout_s / 2)
            except (OSError, LogstoreError):
                pass

        self._each_peer_at_once(tell)

    def _each_peer_at_once(self, call: Any) -> None:
        """Run call(peer) for every peer in parallel threads and wait for all (each call bounds
        its own wait), so that one dead peer delays nothing."""
        threads = [threading.Thread(target=call, args=(peer,), daemon=True) for peer in self.peers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _on_begin_epoch(self, r: Reader) -> bytes:
        rep = self._replica(r)
        epoch, leader = r.int32(), r.int32()
        if rep is not None:
            with rep.cond:
                rep.election.observe_epoch(epoch, leader)
                if rep.election.epoch == epoch and rep.election.leader == leader:
                    rep.leader_seen = time.monotonic()
                    rep.leader_lost = False
                rep.deadline = time.monotonic() + Election.election_timeout(self.election_timeout_s, self._rng)
                rep.cond.notify_all()
        return b""

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
                try:
                    if rep.election.role is Role.LEADER:
                        self._check_leadership(rep, now)
                    elif now >= rep.deadline:
                        if rep.election.leader == NONE and self._discover_leader(rep):
                            with rep.cond:
                                rep.deadline = now + Election.election_timeout(self.election_timeout_s, self._rng)
                            continue
                        self._campaign(rep)
                except LogstoreError as exc:
                    logger.warning("node %d: %s-%d: %s", self.node_id, rep.topic, rep.partition, exc)
                except Exception:  # noqa: BLE001 - e.g. an OSError persisting the election state
                    logger.exception("node %d: %s-%d: election step failed; retrying after a timeout",
                                     self.node_id, rep.topic, rep.partition)
                    with rep.cond:
                        rep.deadline = time.monotonic() + Election.election_timeout(self.election_timeout_s, self._rng)

    def _discover_leader(self, rep: _Replica) -> bool:
        """A node that does not know the leader (it restarted, or missed BEGIN_EPOCH) first asks
        its peers: following a live leader of a newer epoch beats starting an election that would
        depose it. Returns True when it found one."""
        for peer in self.peers:
            try:
                r = self._request(peer, RequestType.METADATA, b"", timeout=self.election_timeout_s / 4)
                r.int32()
                rows = r.array(lambda x: (x.string(), x.int32(), x.int32(), x.int32(), x.int64()), 22)
            except (OSError, LogstoreError):
                continue
            for topic, partition, leader, epoch, _ in rows:
                if (topic, partition) != (rep.topic, rep.partition) or leader in (NONE, self.node_id):
                    continue
                if epoch > rep.election.epoch or (epoch == rep.election.epoch and rep.election.leader == NONE):
                    with rep.cond:
                        rep.election.observe_epoch(epoch, leader)
                    return rep.election.leader == leader
        return False

    def _check_leadership(self, rep: _Replica, now: float) -> None:
        """A leader that has not heard from a majority within the election timeout steps down."""
        heard = 1 + sum(1 for p in self.peers if now - rep.contact.get(p, 0) < 2 * self.election_timeout_s)
        if heard < rep.election.majority:
            with rep.cond:
                rep.election.step_down()
                rep.deadline = now + Election.election_timeout(self.election_timeout_s, self._rng)
                rep.cond.notify_all()
            logger.info("node %d steps down from %s-%d (epoch %d): lost its majority", self.node_id,
                        rep.topic, rep.partition, rep.election.epoch)

    # ------------------------------------------------------------------ fetching
    def _on_fetch(self, r: Reader) -> bytes:
        replica_id = r.int32("replica id")
        rep = self._replica(r)
        epoch, offset, last_epoch = r.int32(), r.int64(), r.int32()
        max_bytes = r.int32("max bytes")
        r.end()
        out = Writer()
        if rep is None:
            return out.int16(UNKNOWN_PARTITION).int32(NONE).int32(-1).int64(0).int32(-1).int64(-1).blob(None).payload()
        if max_bytes <= 0:
            return out.int16(INVALID).int32(NONE).int32(-1).int64(0).int32(-1).int64(-1).blob(None).payload()
        max_bytes = min(max_bytes, self.fetch_max_bytes)
        if replica_id < 0:
            return self._on_consumer_fetch(rep, offset, max_bytes)
        with rep.cond:
            election = rep.election
            if replica_id not in self.peers:  # only a voter's fetch may move our epoch
                return out.int16(INVALID).int32(election.leader).int32(election.epoch).int64(0).int32(-1).int64(-1).blob(None).payload()
            if epoch > election.epoch:
                election.observe_epoch(epoch)
                rep.cond.notify_all()
            if election.role is not Role.LEADER or epoch < election.epoch:
                code = NOT_LEADER if election.role is not Role.LEADER else FENCED_EPOCH
                return out.int16(code).int32(election.leader).int32(election.epoch).int64(0).int32(-1).int64(-1).blob(None).payload()
            log = rep.log
            if last_epoch < 0 and offset > log.log_start_offset:
                # Records without an epoch history (a lost leader-epoch-checkpoint): nothing
                # proves they match ours, so the follower starts again from our log start.
                return (out.int16(OK).int32(self.node_id).int32(election.epoch).int64(rep.hw)
                        .int32(-1).int64(log.log_start_offset).blob(None).payload())
            # KIP-101/279: the follower's last epoch must end where the leader's history says.
            if last_epoch >= 0:
                div_epoch, div_end = log.end_offset_for_epoch(last_epoch)
                if div_epoch != last_epoch or div_end < offset:
                    return (out.int16(OK).int32(self.node_id).int32(election.epoch).int64(rep.hw)
                            .int32(div_epoch).int64(div_end if div_end >= 0 else 0).blob(None).payload())
            now = time.monotonic()
            rep.contact[replica_id] = now
            end = log.log_end_offset
            rep.leo[replica_id] = min(offset, end)  # never count what we do not hold ourselves
            if offset >= end:
                rep.caught_up[replica_id] = now
            self._advance_hw(rep)
            if offset == end:
                # Caught up: hold the fetch until a produce appends (or leadership changes), as
                # Kafka's replica.fetch.wait.max.ms does, instead of letting the follower poll.
                deadline = now + self.fetch_wait_s
                while (log.log_end_offset == offset and election.role is Role.LEADER and election.epoch == epoch
                       and not self._stop.is_set()):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    rep.cond.wait(remaining)
                if election.role is not Role.LEADER or election.epoch != epoch:
                    return out.int16(NOT_LEADER).int32(election.leader).int32(election.epoch).int64(0).int32(-1).int64(-1).blob(None).payload()
                end = log.log_end_offset
                rep.caught_up[replica_id] = time.monotonic()
            try:
                data = log.read_raw(offset, max_bytes) if offset < end else b""
            except OffsetOutOfRangeError:
                return out.int16(OUT_OF_RANGE).int32(self.node_id).int32(election.epoch).int64(rep.hw).int32(-1).int64(log.log_start_offset).blob(None).payload()
            return out.int16(OK).int32(self.node_id).int32(election.epoch).int64(rep.hw).int32(-1).int64(-1).blob(data).payload()

    def _on_consumer_fetch(self, rep: _Replica, offset: int, max_bytes: int) -> bytes:
        """A client's fetch, answered by the leader only (so that a produce acknowledged with
        acks="all" is visible to the next fetch): whole batches from ``offset`` up to the high
        watermark (a consumer never sees a record that is not committed)."""
        out = Writer()
        with rep.cond:
            election = rep.election
            hw = min(rep.hw, rep.log.log_end_offset)
            leader = election.leader
            if election.role is not Role.LEADER:
                return out.int16(NOT_LEADER).int32(leader).int32(election.epoch).int64(hw).int32(-1).int64(-1).blob(None).payload()
        log = rep.log
        start = log.log_start_offset
        if offset < start or offset > hw:
            return out.int16(OUT_OF_RANGE).int32(leader).int32(election.epoch).int64(hw).int32(-1).int64(start).blob(None).payload()
        try:
            data = log.read_raw(offset, max_bytes) if offset < hw else b""
        except OffsetOutOfRangeError as exc:  # retention or truncation moved the range meanwhile
            return (out.int16(OUT_OF_RANGE).int32(leader).int32(election.epoch).int64(hw).int32(-1)
                    .int64(exc.log_start_offset).blob(None).payload())
        # Cut the answer at the high watermark (always a batch boundary: every replica's log
        # end is one, and the high watermark is one of them).
        position = next((p for p, h in batch_headers(data) if h.last_offset >= hw), len(data))
        return out.int16(OK).int32(leader).int32(election.epoch).int64(hw).int32(-1).int64(-1).blob(data[:position]).payload()

    def _advance_hw(self, rep: _Replica) -> None:
        """HW = the largest offset held by a majority, counted only over records of this epoch."""
        ends = sorted([rep.log.log_end_offset] + [rep.leo.get(p, 0) for p in self.peers], reverse=True)
        majority_end = ends[rep.election.majority - 1]
        if majority_end > rep.hw and majority_end > rep.epoch_start:
            rep.hw = majority_end
            rep.log.high_watermark = majority_end
            rep.cond.notify_all()

    def _fetch_loop(self, rep: _Replica) -> None:
        """Follow ``rep``'s leader while this node is one of its followers."""
        key = (rep.topic, rep.partition)
        conn: _Connection | None = None
        conn_peer = NONE
        try:
            while not self._stop.is_set():
                leader = rep.election.leader
                if rep.election.role is not Role.FOLLOWER or leader not in self.peers:
                    self._stop.wait(0.01)
                    continue
                try:
                    if conn is None or conn_peer != leader:
                        if conn is not None:
                            conn.close()
                        conn, conn_peer = None, leader
                        conn = _Connection(self.peers[leader], self.secret, self.node_id, self.election_timeout_s,
                                           self.max_frame, self._client_tls)
                        with self._lock:
                            if self._stop.is_set():
                                conn.close()
                                return
                            self._fetch_conns[key] = conn
                    if not self._fetch_once(rep, leader, conn):
                        self._stop.wait(0.01)  # refused (not the leader, stale epoch): do not spin
                except (OSError, LogstoreError) as exc:
                    logger.debug("node %d: fetch from %d failed: %s", self.node_id, leader, exc)
                    if conn is not None:
                        conn.close()
                        conn = None
                    if isinstance(exc, ConnectionError):
                        self._leader_gone(rep, leader)
                    self._stop.wait(0.01)
                except Exception:  # noqa: BLE001 - the fetcher must outlive one bad answer
                    logger.exception("node %d: %s-%d: fetch from %d failed", self.node_id, rep.topic,
                                     rep.partition, leader)
                    if conn is not None:
                        conn.close()
                        conn = None
                    self._stop.wait(0.1)
        finally:
            with self._lock:
                self._fetch_conns.pop(key, None)
            if conn is not None:
                conn.close()

    def _leader_gone(self, rep: _Replica, leader: int) -> None:
        """The leader refused or dropped our connection: its process is most likely gone (a
        partition or a pause shows as a timeout instead). Campaign within a random fraction of
        the election timeout rather than waiting all of it out."""
        with rep.cond:
            if rep.election.role is Role.FOLLOWER and rep.election.leader == leader:
                rep.leader_lost = True
                soon = time.monotonic() + self._rng.uniform(0.0, self.election_timeout_s / 2)
                rep.deadline = min(rep.deadline, soon)

    def _fetch_once(self, rep: _Replica, leader: int, conn: _Connection) -> bool:
        """One fetch; returns False when the leader refused it."""
        log = rep.log
        offset = log.log_end_offset
        last_epoch = log.latest_epoch
        payload = (Writer().int32(self.node_id).string(rep.topic).int32(rep.partition).int32(rep.election.epoch)
                   .int64(offset).int32(last_epoch).int32(self.fetch_max_bytes).payload())
        # The leader holds a caught-up fetch for up to fetch_wait_s: allow for that.
        r = conn.request(RequestType.FETCH, payload, timeout=self.election_timeout_s + self.fetch_wait_s)
        code, leader_id, epoch, hw = r.int16(), r.int32(), r.int32(), r.int64()
        div_epoch, div_end = r.int32(), r.int64()
        data = r.blob()
        with rep.cond:
            if epoch > rep.election.epoch:
                rep.election.observe_epoch(epoch, leader_id if code in (OK, FENCED_EPOCH) else NONE)
            if code == OUT_OF_RANGE and epoch == rep.election.epoch and div_end > offset:
                # The leader's log now starts past our end (retention or DeleteRecords there):
                # nothing we hold can be kept; restart empty at its log start and fetch from it.
                logger.warning("node %d: %s-%d: the leader's log starts at %d, past our end %d; restarting there",
                               self.node_id, rep.topic, rep.partition, div_end, offset)
                log.truncate_fully_and_start_at(div_end)
                self._forget_producers_from(rep, log.log_start_offset)
                return True
            if code != OK or epoch != rep.election.epoch:
                if code == NOT_LEADER and leader_id != NONE and leader_id != leader:
                    rep.election.observe_epoch(epoch, leader_id)
                return False
            rep.deadline = time.monotonic() + Election.election_timeout(self.election_timeout_s, self._rng)
            rep.leader_seen = time.monotonic()
            rep.leader_lost = False
        if div_epoch != -1 or (data is None and div_end >= 0):
            # KIP-279: the leader named the largest epoch it has at or below ours and where that
            # epoch ends in its log. Our history agrees up to the smaller of that end and the end
            # of the same epoch (or, lacking it, of our largest older one) in our own log. Each
            # round shortens the log or lowers our latest epoch, so a history that diverged over
            # several epochs converges in a few fetches.
            own_end = log.end_offset_for_epoch(div_epoch)[1] if div_epoch >= 0 else div_end
            target = min(div_end, own_end if own_end >= 0 else div_end, log.log_end_offset)
            logger.info("node %d: %s-%d diverges from the leader (its epoch %d ends at %d); truncating to %d",
                        self.node_id, rep.topic, rep.partition, div_epoch, div_end, target)
            log.truncate_to(max(target, 0))
            with rep.cond:
                self._forget_producers_from(rep, log.log_end_offset)
            return True
        if data:
            base = parse_header(data, 0).base_offset
            if base < offset and log.log_start_offset == offset:
                # Restarted past its end, the log is empty, but the leader's log start lies
                # inside this batch: start at the batch instead (as Kafka's follower does).
                log.truncate_fully_and_start_at(base)
                with rep.cond:
                    self._forget_producers_from(rep, base)
            log.append_replicated(data)
            with rep.cond:
                self._note_producers(rep, data)
        with rep.cond:
            if rep.election.role is Role.FOLLOWER and rep.election.epoch == epoch:
                end = log.log_end_offset
                log.high_watermark = max(log.log_start_offset, min(hw, end))
                rep.hw = log.high_watermark
        return True

    # ------------------------------------------------------------------ produce
    def _in_sync(self, rep: _Replica, now: float) -> int:
        end = rep.log.log_end_offset
        return 1 + sum(1 for p in self.peers
                       if rep.leo.get(p, -1) >= end or now - rep.caught_up.get(p, -1e9) < self.replica_lag_s)

    def _on_produce(self, r: Reader) -> bytes:
        rep = self._replica(r)
        acks, timeout_ms = r.int8(), r.int32()
        batch = r.blob("record batch")
        r.end()
        out = Writer()
        if rep is None or batch is None:
            return out.int16(UNKNOWN_PARTITION if rep is None else INVALID).int32(NONE).int64(-1).int64(-1).payload()
        try:
            # Checked before the lock: a bad batch costs the sender, not the partition.
            header = validate_client_batch(batch, rep.log.config.max_message_bytes)
        except CorruptRecordError:
            return out.int16(CORRUPT_BATCH).int32(self.node_id).int64(-1).int64(-1).payload()
        except RecordTooLargeError:
            return out.int16(RECORD_TOO_LARGE).int32(self.node_id).int64(-1).int64(-1).payload()
        except InvalidRecordError:
            return out.int16(INVALID_RECORD).int32(self.node_id).int64(-1).int64(-1).payload()
        producer_id, base_sequence = header.producer_id, header.base_sequence
        with rep.cond:
            election = rep.election
            if election.role is not Role.LEADER:
                return out.int16(NOT_LEADER).int32(election.leader).int64(-1).int64(-1).payload()
            epoch = election.epoch
            if acks == -1 and self._in_sync(rep, time.monotonic()) < self.min_insync:
                return out.int16(NOT_ENOUGH_REPLICAS).int32(self.node_id).int64(-1).int64(-1).payload()
            known = rep.producers.get(producer_id) if producer_id >= 0 else None
            if known is not None and known[0] == base_sequence:
                first, last = known[1], known[2]  # a retry of a produce already appended
            else:
                try:
                    first = rep.log.append_encoded(batch)
                except InvalidRecordError:  # e.g. a record without a key in a compacted log
                    return out.int16(INVALID_RECORD).int32(self.node_id).int64(-1).int64(-1).payload()
                last = first + header.records_count - 1
                if producer_id >= 0:
                    rep.producers[producer_id] = (base_sequence, first, last)
                self._advance_hw(rep)  # a set of one commits on its own append
                rep.cond.notify_all()  # wake the followers' held fetches
            if acks == -1:
                deadline = time.monotonic() + timeout_ms / 1000.0
                while True:
                    # Role and epoch first: a node deposed meanwhile may have learnt a high
                    # watermark past `last` from the new leader, for records that replaced ours.
                    if election.role is not Role.LEADER or election.epoch != epoch or self._stop.is_set():
                        return out.int16(NOT_LEADER).int32(election.leader).int64(first).int64(last).payload()
                    if rep.hw > last:
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return out.int16(TIMEOUT).int32(self.node_id).int64(first).int64(last).payload()
                    rep.cond.wait(min(remaining, 0.05))
        return out.int16(OK).int32(self.node_id).int64(first).int64(last).payload()

    def _on_metadata(self, r: Reader) -> bytes:
        out = Writer().int32(self.node_id)
        reps = list(self._replicas.values())
        out.array(reps, lambda w, rep: w.string(rep.topic).int32(rep.partition)
                  .int32(rep.election.leader).int32(rep.election.epoch).int64(rep.hw))
        # Where every voter listens (as this node reaches it), so that a client told "node N
        # leads" can go straight to N.
        nodes = [(self.node_id, self.address)] + sorted(self.peers.items())
        return out.array(nodes, lambda w, n: w.int32(n[0]).string(str(n[1][0])).int32(int(n[1][1]))).payload()

    # ------------------------------------------------------------------ outgoing requests
    def _request(self, peer: int, type: int, payload: bytes, timeout: float) -> Reader:
        with self._lock:
            conn = self._conns.get(peer)
        if conn is None:
            # Connect and authenticate without holding the node's lock (a slow peer must not
            # hold up requests to the others); the first connection registered wins.
            fresh = _Connection(self.peers[peer], self.secret, self.node_id, timeout, self.max_frame,
                                self._client_tls)
            with self._lock:
                conn = self._conns.setdefault(peer, fresh)
                stopped = self._stop.is_set()
            if conn is not fresh or stopped:
                fresh.close()
            if stopped:
                raise ConnectionError(f"node {self.node_id} is stopping")
        try:
            with conn.lock:
                return conn.request(type, payload, timeout)
        except (OSError, LogstoreError):
            self._drop(peer)
            raise

    def _drop(self, peer: int) -> None:
        with self._lock:
            conn = self._conns.pop(peer, None)
        if conn is not None:
            conn.close()

    def read(self, topic: str, partition: int, offset: int, max_records: int | None = None) -> list[Record]:
        """Records of this replica from ``offset`` on, below its high watermark only: what a
        consumer may see (a follower's uncommitted tail may still be truncated). Thread-safe.

        Raises:
            ReplicationError: an unknown partition. OffsetOutOfRangeError: ``offset`` outside
            [log start, high watermark].
        """
        rep = self._replicas.get((topic, partition))
        if rep is None:
            raise ReplicationError(f"{topic}-{partition} is not replicated by node {self.node_id}", UNKNOWN_PARTITION)
        with rep.cond:
            hw = min(rep.hw, rep.log.log_end_offset)
        if offset > hw:
            raise OffsetOutOfRangeError(offset, rep.log.log_start_offset, hw, f"read from {topic}-{partition}")
        return rep.log.read(offset, max_records=max_records, max_offset=hw)

    def describe(self) -> dict[tuple[str, int], dict[str, Any]]:
        """Per partition: role, leader, epoch, high watermark, log end, in-sync replicas."""
        now = time.monotonic()
        out = {}
        for key, rep in self._replicas.items():
            with rep.cond:
                leader = rep.election.role is Role.LEADER
                isr = [self.node_id] + [p for p in self.peers if leader and (
                    rep.leo.get(p, -1) >= rep.log.log_end_offset or now - rep.caught_up.get(p, -1e9) < self.replica_lag_s)]
                out[key] = dict(role=rep.election.role.value, leader=rep.election.leader, epoch=rep.election.epoch,
                                high_watermark=rep.hw, log_end_offset=rep.log.log_end_offset,
                                in_sync=isr if leader else None)
        return out

    def metrics(self) -> dict[str, Any]:
        """The store's metrics (:meth:`LogStore.metrics`) plus replication: how many partitions
        this node leads without every voter in sync (Kafka's UnderReplicatedPartitions), the
        largest follower lag in records (MaxLag) and each follower's lag by (topic, partition,
        follower). Thread-safe."""
        out = self.store.metrics()
        now = time.monotonic()
        lag: dict[tuple[str, int, int], int] = {}
        under = 0
        for (topic, partition), rep in self._replicas.items():
            with rep.cond:
                if rep.election.role is not Role.LEADER:
                    continue
                end = rep.log.log_end_offset
                in_sync = 1
                for peer in self.peers:
                    lag[(topic, partition, peer)] = max(0, end - max(rep.leo.get(peer, 0), 0))
                    if rep.leo.get(peer, -1) >= end or now - rep.caught_up.get(peer, -1e9) < self.replica_lag_s:
                        in_sync += 1
                under += in_sync < len(self.peers) + 1
        out["kafka.server:type=ReplicaManager,name=UnderReplicatedPartitions"] = under
        out["kafka.server:type=ReplicaFetcherManager,name=MaxLag,clientId=Replica"] = max(lag.values(), default=0)
        out["logstore:type=Replica,name=FollowerLag"] = lag
        return out


class Fetched(NamedTuple):
    """What :meth:`Client.fetch` returns."""

    #: committed records from the offset asked for (control records left out)
    records: list[Record]
    #: the offset to fetch next: past every batch returned, control batches included
    next_offset: int
    #: the answering replica's high watermark
    high_watermark: int


class Client:
    """Produces to and reads from a replica set, following its leader.

    Args:
        bootstrap: [(host, port)] of some nodes.
        secret: the shared secret.
        timeout: seconds for a connection or a request, and the default for produce/fetch.
        tls: mutual TLS (required when the nodes use it).
        compression_type: codec of produced batches ("gzip", "snappy", "lz4", "zstd"; None: none).

    Thread-safety: one thread at a time (give each thread its own Client).
    """

    def __init__(self, bootstrap: Iterable[tuple[str, int]], secret: bytes, timeout: float = 10.0,
                 tls: TLSConfig | None = None, compression_type: str | None = None) -> None:
        self.bootstrap = list(bootstrap)
        if not self.bootstrap:
            raise ValueError("bootstrap needs at least one (host, port)")
        self.secret = secret
        self.timeout = timeout
        self._tls = tls.client_context() if tls is not None else None
        self._conns: dict[tuple[str, int], _Connection] = {}
        #: Idempotence: every produce carries this id and a per-partition sequence number, so a
        #: retry after a lost response is recognised by the leader instead of appended again.
        self.producer_id = random.SystemRandom().getrandbits(62)
        self._sequences: dict[tuple[str, int], int] = {}
        self._builder = BatchBuilder()
        #: node id -> address, learnt from METADATA answers
        self._nodes: dict[int, tuple[str, int]] = {}
        #: (topic, partition) -> the node last seen leading it
        self._leaders: dict[tuple[str, int], int] = {}
        self._codec = compression.codec_from_name(compression_type) if compression_type else compression.NONE

    def _conn(self, address: tuple[str, int]) -> _Connection:
        conn = self._conns.get(address)
        if conn is None:
            conn = self._conns[address] = _Connection(address, self.secret, NONE, self.timeout, DEFAULT_MAX_FRAME,
                                                      self._tls)
        return conn

    def _call(self, address: tuple[str, int], type: int, payload: bytes, wait: float = 0.0) -> Reader:
        """One request; a cached connection the node closed meanwhile (idle limit, restart) is
        replaced once. ``wait`` is how long the node may hold the request (an acks="all"
        produce): the socket waits that much longer. Raises OSError/LogstoreError when the
        node cannot answer."""
        reused = address in self._conns
        timeout = self.timeout + wait
        try:
            return self._conn(address).request(type, payload, timeout=timeout)
        except socket.timeout:
            self._drop(address)
            raise  # the node may still be working on it: never send it twice from here
        except (OSError, LogstoreError):
            self._drop(address)
            if not reused:
                raise
        try:
            return self._conn(address).request(type, payload, timeout=timeout)
        except (OSError, LogstoreError):
            self._drop(address)
            raise

    def _drop(self, address: tuple[str, int]) -> None:
        conn = self._conns.pop(address, None)
        if conn is not None:
            conn.close()

    def produce(self, topic: str, partition: int, values: list[bytes | None], keys: list[bytes | None] | None = None,
                acks: int | str = "all", timeout: float | None = None) -> list[int]:
        """Append records on the leader; returns their offsets. With acks="all" it returns once
        they are committed (held by a majority).

        Raises:
            NotEnoughReplicasError, ReplicationError: as the leader answers; NotLeaderError when no
            leader could be found before ``timeout``.
        """
        code = {0: 0, 1: 1, "all": -1, -1: -1}.get(acks)  # type: ignore[call-overload]
        if code is None:
            raise ValueError(f"acks must be 0, 1 or 'all', got {acks!r}")
        sequence = self._sequences.get((topic, partition), 0)
        # One record batch, encoded here by the C encoder and stored by the leader as it is
        # (as Kafka's producer does); the producer id and sequence travel in its header.
        batch = self._builder.build(values, keys, producer_id=self.producer_id, producer_epoch=0,
                                    base_sequence=sequence, codec=self._codec)
        self._sequences[(topic, partition)] = (sequence + len(values)) % (1 << 31)
        payload = (Writer().string(topic).int32(partition).int8(code).int32(int((timeout or self.timeout) * 1000))
                   .blob(bytes(batch)).payload())
        err, leader, r = self._leader_request((topic, partition), RequestType.PRODUCE, payload,
                                              timeout or self.timeout, f"produce to {topic}-{partition}",
                                              wait=(timeout or self.timeout) if code == -1 else 0.0)
        first, last = r.int64(), r.int64()
        _raise_for(err, leader, f"produce to {topic}-{partition}")
        return list(range(first, last + 1))

    def _candidates(self, key: tuple[str, int]) -> list[tuple[str, int]]:
        """Addresses to try: the partition's last known leader first, then the bootstrap list."""
        leader = self._leaders.get(key)
        first = [self._nodes[leader]] if leader is not None and leader in self._nodes else []
        return first + [a for a in self.bootstrap if a not in first]

    def _follow(self, key: tuple[str, int], leader: int, refused_by: tuple[str, int]) -> bool:
        """A node refused a request naming ``leader`` (-1: unknown). Remember it, learning its
        address from the refusing node when needed; True when there is a new address to try."""
        if leader < 0:
            self._leaders.pop(key, None)
            return False
        self._leaders[key] = leader
        if leader not in self._nodes:
            try:
                self._read_metadata(self._call(refused_by, RequestType.METADATA, b""))
            except (OSError, LogstoreError):
                return False
        return self._nodes.get(leader, refused_by) != refused_by

    def _leader_request(self, key: tuple[str, int], type: int, payload: bytes, timeout: float,
                        what: str, wait: float = 0.0) -> tuple[int, int, Reader]:
        """Send a request the partition's leader must answer, following "not the leader"
        answers that name the leader, until a node accepts it or ``timeout`` passes. Returns
        (error code, leader id, the rest of the answer)."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        redirects = 0
        while time.monotonic() < deadline:
            redirected = False
            for address in self._candidates(key):
                try:
                    r = self._call(address, type, payload, wait)
                except (OSError, LogstoreError) as exc:
                    last_error = exc
                    continue
                err, leader = r.int16(), r.int32()
                if err != NOT_LEADER:
                    if err == OK and leader >= 0:
                        self._leaders[key] = leader
                        self._nodes.setdefault(leader, address)
                    return err, leader, r
                last_error = NotLeaderError(f"node at {address[0]}:{address[1]} is not the leader"
                                            + (f" (node {leader} is)" if leader >= 0 else ""), err, leader)
                if redirects < 8 and self._follow(key, leader, address):
                    redirects += 1
                    redirected = True
                    break  # straight to the leader it named
            if not redirected:
                time.sleep(0.05)
        raise NotLeaderError(f"{what}: no leader answered within the timeout ({last_error})", NOT_LEADER,
                             getattr(last_error, "leader", NONE))

    def _read_metadata(self, r: Reader) -> dict[tuple[str, int], tuple[int, int, int]]:
        r.int32()
        rows = r.array(lambda x: (x.string(), x.int32(), x.int32(), x.int32(), x.int64()), 22)
        nodes = r.array(lambda x: (x.int32(), x.string(), x.int32()), 10)
        for node, host, port in nodes:
            self._nodes.setdefault(node, (host, port))
        return {(t, p): (leader, epoch, hw) for t, p, leader, epoch, hw in rows}

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20,
              timeout: float | None = None) -> Fetched:
        """Committed records of a partition from ``offset`` on (about ``max_bytes`` of batches,
        at least one when any is committed), from its leader. An empty answer means nothing is
        committed at or after ``offset`` yet; fetch again from ``next_offset``.

        Raises:
            OffsetOutOfRangeError: ``offset`` below the log start or above the high watermark.
            NotLeaderError: no leader answered before ``timeout``.
            CorruptRecordError: a batch failed its CRC on arrival.
        """
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        payload = (Writer().int32(-1).string(topic).int32(partition).int32(-1).int64(offset).int32(-1)
                   .int32(min(max_bytes, DEFAULT_MAX_FRAME - 4096)).payload())
        err, leader, r = self._leader_request((topic, partition), RequestType.FETCH, payload,
                                              timeout or self.timeout, f"fetch from {topic}-{partition}")
        _epoch, hw = r.int32(), r.int64()
        _div_epoch, start = r.int32(), r.int64()
        data = r.blob() or b""
        if err == OUT_OF_RANGE:
            raise OffsetOutOfRangeError(offset, start, hw, f"fetch from {topic}-{partition}")
        _raise_for(err, leader, f"fetch from {topic}-{partition}")
        return Fetched(decode_batches(data, offset), _end_of(data, offset), hw)

    def metadata(self) -> dict[tuple[str, int], tuple[int, int, int]]:
        """{(topic, partition): (leader, epoch, high watermark)} as the first reachable node knows it."""
        for address in self.bootstrap:
            try:
                r = self._call(address, RequestType.METADATA, b"")
            except (OSError, LogstoreError):
                continue
            return self._read_metadata(r)
        raise ReplicationError("no node reachable")

    def close(self) -> None:
        """Close every connection."""
        for address in list(self._conns):
            self._drop(address)



def _end_of(data: bytes, offset: int) -> int:
    """The offset after the whole batches in ``data`` (``offset`` when there are none)."""
    for _, h in batch_headers(data):
        offset = max(offset, h.last_offset + 1)
    return offset


def main(argv: list[str] | None = None, prog: str = "python -m logstore.replication") -> int:
    """Run one replica node until SIGTERM/SIGINT: ``logstore node --node-id 0 --data-dir DIR
    --listen 127.0.0.1:9000 --peer 1=127.0.0.1:9001 --peer 2=127.0.0.1:9002 --secret-file FILE
    [--topic NAME:PARTITIONS] [--tls-cert F --tls-key F --tls-ca F]``. Prints one "serving"
    line on stdout once it listens."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog=prog, description=main.__doc__)
    parser.add_argument("--node-id", type=int, required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--listen", required=True, help="host:port")
    parser.add_argument("--peer", action="append", default=[], help="id=host:port (repeat)")
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--topic", action="append", default=[], help="name:partitions (default replicated:1)")
    parser.add_argument("--election-timeout-ms", type=int, default=1000)
    parser.add_argument("--min-insync-replicas", type=int, default=2)
    parser.add_argument("--log-level", default="WARNING", help="logging level for the node (INFO shows elections)")
    parser.add_argument("--tls-cert", help="PEM certificate of this node (with --tls-key and --tls-ca: mutual TLS)")
    parser.add_argument("--tls-key", help="PEM private key of this node")
    parser.add_argument("--tls-ca", help="PEM CA certificate(s) that peers' and clients' certificates must chain to")
    parser.add_argument("--max-connections", type=int, default=256)
    parser.add_argument("--connections-max-idle-ms", type=int, default=600_000)
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

    peers = {}
    for item in args.peer:
        node, _, addr = item.partition("=")
        if not node.isdigit():
            parser.error(f"expected id=host:port, got {item!r}")
        peers[int(node)] = address(addr)
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
        node = ReplicaNode(args.node_id, args.data_dir, address(args.listen), peers, secret, partitions=topics,
                           election_timeout_ms=args.election_timeout_ms,
                           min_insync_replicas=args.min_insync_replicas,
                           tls=TLSConfig(*tls_files) if all(tls_files) else None,
                           max_connections=args.max_connections,
                           connections_max_idle_ms=args.connections_max_idle_ms).start()
    except (ValueError, OSError, LogstoreError) as exc:
        parser.error(str(exc))
    import faulthandler

    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid> prints every thread's stack
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    print(f"node {args.node_id} serving on {node.address[0]}:{node.address[1]}", flush=True)
    done.wait()
    node.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
