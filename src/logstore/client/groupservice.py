"""Consumer groups across processes: the store's group coordinator, and a process's membership.

Every process (more exactly: every :class:`~logstore.store.store.LogStore` object) whose consumers
belong to a group takes part in it as *one* member of a Kafka group, speaking Kafka's classic
protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit) to the store's coordinator;
its own consumers of the group then split the partitions the group gave it (see
:mod:`logstore.client.consumer`).

The coordinator (:class:`GroupService`): whichever store object holds an flock on
``<root>/.groups.lock`` serves Kafka's protocol on the Unix socket ``<root>/.groups.sock``
(a :class:`~logstore.kafka.server.KafkaServer` over the same store: the coordinator code of the
Kafka listener, :mod:`logstore.groups.coordinator`). The others connect to it. When the holder goes
away (it closes the store, or dies: the kernel drops its lock), its members' connections end,
and the first to ask takes the lock and serves in its place; since membership is stored in
``__consumer_offsets`` (:mod:`logstore.groups.metadata`), the new coordinator knows the group,
the new coordinator rebalances it at once: the live members join the next generation, and the
members of a dead process are dropped without waiting. A process's liveness is its flock on
``<root>/.groups/<token>`` (its members' client id is ``logstore-<token>``): the kernel drops
the lock when the process dies, however it dies, and the coordinator's ``liveness`` probe
(:class:`~logstore.groups.coordinator.GroupConfig`) tries the lock while a rebalance waits for members.
In a stable group a dead process's partitions move after its session timeout, as in Kafka.

A membership (:class:`Membership`): joins (the leader computes Kafka's range assignment over
the members' topics), then heartbeats from a daemon thread every ``heartbeat_interval_ms``.
When the group rebalances (another process joins or leaves, or a member's session ends), it
gives up every partition (eager, as Kafka's classic protocol: positions are committed first with
auto-commit), joins again and takes its new share. Commits carry its generation: a process the
group has removed cannot commit over its successor (CommitFailedError).

Durability: committed offsets as :mod:`logstore.groups.offsets` (fsynced); membership is soft state
written at each stable generation.
Thread-safety: thread-safe. A membership's methods run under its owner's lock (the consumer
module's group lock), the heartbeat thread takes that lock before it rebalances.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
import weakref
from typing import Any, Callable

from .. import _fileio
from ..errorcodes import ErrorCode
from ..net import server as net
from ..errors import CommitFailedError, LogClosedError, LogstoreError
from ..kafka.groupclient import GroupClient, range_assign
from ..kafka.client import KafkaClientError
from ..kafka.server import KafkaServer

__all__ = ["GroupService", "Membership", "CommitFailedError", "group_service", "LOCK_NAME", "SOCKET_NAME"]

logger = logging.getLogger("logstore.groups")

LOCK_NAME = ".groups.lock"
SOCKET_NAME = ".groups.sock"
#: the directory of the members' liveness files: ``<token>``, flocked by its store object
ALIVE_DIR = ".groups"
_CLIENT_PREFIX = "logstore-"
#: the local coordinator accepts sessions down to this (Kafka's broker default is 6000)
MIN_SESSION_TIMEOUT_MS = 500
#: the coordinator's answers that say the group no longer has this member (in this generation)
_REMOVED = frozenset({ErrorCode.unknown_member_id, ErrorCode.illegal_generation, ErrorCode.fenced_instance_id})


class GroupService:
    """The store object's way to its group coordinator (see the module docstring).

    Thread-safety: thread-safe.
    """

    def __init__(self, store: Any) -> None:
        self._store = weakref.ref(store)  # the store owns this service, not the other way round
        self.root = store.root
        self.path = os.path.join(store.root, SOCKET_NAME)
        self._lock = threading.Lock()
        self._lock_fd = -1
        self._pid = os.getpid()
        self._server: KafkaServer | None = None
        self._closed = False
        self._alive_fd = -1
        self.token = ""

    @property
    def client_id(self) -> str:
        """The client id of this store object's members: names its liveness file."""
        with self._lock:
            self._check_fork()
            if self._closed:  # no new liveness file once closed
                raise LogClosedError(f"store {self.root} is closed")
            if self._alive_fd < 0:
                self._take_alive_file()
            return _CLIENT_PREFIX + self.token

    def _check_fork(self) -> None:
        """In a forked child, forget the parent's lock, server and liveness file (holds ``_lock``;
        the inherited descriptors are closed: the parent's locks stay the parent's)."""
        if self._pid != os.getpid():
            for fd in (self._lock_fd, self._alive_fd):
                if fd >= 0:
                    _fileio.ops.close(fd)
            self._lock_fd, self._alive_fd, self._server, self._pid = -1, -1, None, os.getpid()

    def reset_after_fork(self) -> None:
        """In a forked child, before anything else runs there (the at-fork hook calls it, the
        child having one thread): a new lock, whatever a parent's thread held of the old one,
        and the parent's lock, server and liveness file forgotten."""
        self._lock = threading.Lock()
        self._check_fork()

    def _take_alive_file(self) -> None:
        """Create and flock this store object's liveness file: locked under a temporary name,
        then renamed, so that no prober ever finds it unlocked (holds ``_lock``)."""
        directory = os.path.join(self.root, ALIVE_DIR)
        _fileio.ops.makedirs(directory)
        token = uuid.uuid4().hex
        tmp = os.path.join(directory, token + ".tmp")
        fd = _fileio.ops.open(tmp, os.O_RDWR | os.O_CREAT)
        try:
            if not _fileio.ops.lock(fd, blocking=False):
                raise LogstoreError(f"cannot lock the new liveness file {tmp}")
            _fileio.ops.rename(tmp, os.path.join(directory, token))
        except BaseException:
            _fileio.ops.close(fd)
            raise
        self._alive_fd, self.token = fd, token

    def alive(self, client_id: str) -> bool:
        """The coordinator's liveness probe: False when ``client_id`` is one of the store's
        members whose store object is gone (its liveness file is missing, or unlocked: its
        process ended, the kernel dropped the lock); True for anything else."""
        token = client_id[len(_CLIENT_PREFIX):] if client_id.startswith(_CLIENT_PREFIX) else ""
        if len(token) != 32 or not all(c in "0123456789abcdef" for c in token):
            return True  # not one of ours: Kafka's rules only
        path = os.path.join(self.root, ALIVE_DIR, token)
        try:
            fd = _fileio.ops.open(path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            if not _fileio.ops.lock(fd, blocking=False):
                return True
            try:
                _fileio.ops.unlink(path)  # dead: its file goes while we hold the lock
            except FileNotFoundError:
                pass  # its owner closed and removed it meanwhile
            return False
        finally:
            _fileio.ops.close(fd)

    def _sweep(self) -> None:
        """Remove the liveness files of processes that ended without removing theirs."""
        directory = os.path.join(self.root, ALIVE_DIR)
        try:
            names = _fileio.ops.listdir(directory)
        except FileNotFoundError:
            return
        for name in names:
            if len(name) == 32 and name != self.token:
                self.alive(_CLIENT_PREFIX + name)

    @property
    def leading(self) -> bool:
        """True while this store object serves the coordinator."""
        return self._server is not None and self._pid == os.getpid()

    def connect(self, client_id: str, timeout: float) -> GroupClient:
        """A connection to the coordinator, taking its place if nobody serves it.

        Raises:
            LogClosedError: the store is closed.
            KafkaClientError: no coordinator could be reached within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                store = self._store()
                if self._closed or store is None or store.closed:
                    raise LogClosedError(f"store {self.root} is closed")
                self._check_fork()
                if self._server is None:
                    self._try_lead(store)
                del store
            try:
                sock = net.connect_unix(self.path, min(timeout, 5.0))
                return GroupClient(sock, self.path, client_id)
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise KafkaClientError(f"no group coordinator at {self.path}: {exc}") from None
                time.sleep(0.02)

    def _try_lead(self, store: Any) -> None:
        """Serve the coordinator if the store's group lock is free (holds ``_lock``)."""
        if self._lock_fd < 0:
            self._lock_fd = _fileio.ops.open(os.path.join(self.root, LOCK_NAME), os.O_RDWR | os.O_CREAT)
        if not _fileio.ops.lock(self._lock_fd, blocking=False):
            return
        try:
            os.unlink(self.path)  # a dead coordinator's socket
        except FileNotFoundError:
            pass
        try:
            self._sweep()
            self._server = KafkaServer(store, self.path, auto_create_topics=False,
                                       group_min_session_timeout_ms=MIN_SESSION_TIMEOUT_MS,
                                       group_initial_rebalance_delay_ms=0, group_liveness=self.alive).start()
        except BaseException:  # serve, or let another take the lock
            _fileio.ops.close(self._lock_fd)
            self._lock_fd = -1
            raise
        logger.info("%s: serving the store's group coordinator on %s", self.root, self.path)

    def close(self) -> None:
        """Stop serving (members elsewhere take over) and release the lock. Idempotent."""
        with self._lock:
            self._check_fork()
            self._closed = True
            server, self._server = self._server, None
            fd, self._lock_fd = self._lock_fd, -1
            alive_fd, self._alive_fd = self._alive_fd, -1
        if server is not None:
            server.stop()
        if fd >= 0:
            _fileio.ops.close(fd)
        if alive_fd >= 0:
            try:
                _fileio.ops.unlink(os.path.join(self.root, ALIVE_DIR, self.token))
            except FileNotFoundError:
                pass
            _fileio.ops.close(alive_fd)


_SERVICES: "weakref.WeakKeyDictionary[Any, GroupService]" = weakref.WeakKeyDictionary()
_SERVICES_LOCK = threading.Lock()
_MEMBERSHIPS: "weakref.WeakSet[Membership]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child holds none of its parent's group state: the inherited lock and liveness
    descriptors are closed (the flocks stay the parent's, so a dead parent's coordinator is
    taken over), and each membership starts over as a new member of the child's own."""
    global _SERVICES_LOCK
    _SERVICES_LOCK = threading.Lock()
    for service in list(_SERVICES.values()):
        service.reset_after_fork()
    for membership in list(_MEMBERSHIPS):
        membership.reset_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def group_service(store: Any) -> GroupService:
    """The store object's one GroupService (closed with the store)."""
    with _SERVICES_LOCK:
        found = _SERVICES.get(store)
        if found is None:
            found = _SERVICES[store] = GroupService(store)
            store.add_closer(found.close)
        return found


class Membership:
    """This store object's member of one group (see the module docstring).

    Args:
        store: the LogStore.
        group: the group id.
        lock: the owner's lock; every call here is made holding it, and the heartbeat thread
            takes it before it rebalances.
        revoke: ``revoke(commit)``: give up every partition, committing positions first when
            ``commit`` (called with ``lock`` held).
        assign: ``assign(partitions)``: take the set of (topic, partition) the group gave.
        session_timeout_ms, heartbeat_interval_ms: as Kafka's consumer settings.
    """

    def __init__(self, store: Any, group: str, lock: threading.RLock, revoke: Callable[[bool], None],
                 assign: Callable[[set[tuple[str, int]]], None], session_timeout_ms: int,
                 heartbeat_interval_ms: int) -> None:
        self._store = weakref.ref(store)
        self.group = group
        self.service = group_service(store)
        self._lock = lock
        self._revoke = revoke
        self._assign = assign
        self.session_ms = session_timeout_ms
        self.rebalance_ms = session_timeout_ms
        self.interval_s = heartbeat_interval_ms / 1000.0
        self.topics: frozenset[str] = frozenset()
        self.member_id = ""
        self.generation = -1
        #: the partition counts this member assigned with as the group's leader (None: not the
        #: leader); a count grown since makes it rejoin, as Kafka's consumer leader does
        self.assigned_counts: dict[str, int] | None = None
        self._client: GroupClient | None = None
        self._io = threading.Lock()  # one request at a time on the connection
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        _MEMBERSHIPS.add(self)

    def reset_after_fork(self) -> None:
        """In a forked child, before anything else runs there (the at-fork hook calls it, the
        child having one thread): the membership starts over as a new member of the child's
        own, with no connection and no heartbeat thread (the parent's stay the parent's)."""
        self._io = threading.Lock()
        self._client = None
        self._thread = None
        self.member_id, self.generation = "", -1

    @property
    def store(self) -> Any:
        """The store (LogClosedError once it is gone)."""
        store = self._store()
        if store is None:
            raise LogClosedError(f"the store of group {self.group} is gone")
        return store

    # ------------------------------------------------------------------ requests
    def _request(self, call: Callable[[GroupClient], Any]) -> Any:
        """One request, on a new connection (and a coordinator taken over) when the old one is
        gone. Retried for up to a session timeout: a coordinator's process that is dying may
        still accept a connection and then reset it. Every request here may be sent twice."""
        deadline = time.monotonic() + self.session_ms / 1000.0
        while True:
            with self._io:
                if self._client is None or self._pid != os.getpid():
                    self._pid = os.getpid()
                    self._client = None
                    self._client = self.service.connect(self.service.client_id, self.session_ms / 1000.0)
                try:
                    return call(self._client)
                except KafkaClientError as exc:
                    self._client = None
                    if time.monotonic() >= deadline:
                        raise
                    logger.info("group %s: the coordinator's connection failed (%s); trying again", self.group, exc)
            time.sleep(0.02)

    # ------------------------------------------------------------------ membership
    def subscribe(self, topics: frozenset[str]) -> None:
        """Join with ``topics`` (holds the lock): the first time, or again when they changed."""
        if topics == self.topics and self.generation >= 0 and self._running():
            return
        self.topics = topics
        self.rejoin(commit=True)
        self._start()

    def _running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._pid == os.getpid()

    def _start(self) -> None:
        if not self._running():
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._heartbeats, args=(self._stop,),
                                            name=f"logstore-group-{self.group}", daemon=True)
            self._thread.start()

    def rejoin(self, commit: bool) -> None:
        """Give up every partition, join the group's next generation and take this process's
        share (holds the lock). Retries until it has one, or the store closes."""
        was_member = self.generation >= 0
        self.generation = -1  # what the consumers take up now comes from no generation
        self._revoke(commit and was_member)  # their commits carry their own (old) generation
        while True:
            try:
                if self._join_once():
                    return
            except KafkaClientError as exc:
                logger.info("group %s: %s; joining again", self.group, exc)
            if self.store.closed:
                raise LogClosedError(f"store {self.store.root} is closed")
            time.sleep(0.05)

    def _join_once(self) -> bool:
        answer = self._request(lambda c: c.join(self.group, self.member_id, self.session_ms, self.rebalance_ms,
                                                self.topics))
        if answer.error == ErrorCode.unknown_member_id:
            self.member_id = ""
            return False
        if answer.error != ErrorCode.none:
            logger.info("group %s: JoinGroup answered error %d", self.group, answer.error)
            return False
        self.member_id = answer.member_id
        assignments: dict[str, dict[str, list[int]]] = {}
        if answer.leader == answer.member_id:
            counts = {}
            for topic in {t for ts in answer.members.values() for t in ts}:
                try:
                    counts[topic] = self.store.partitions_for(topic)
                except LogstoreError:
                    pass  # a topic this store object does not know: nobody gets it
            assignments = range_assign(answer.members, counts)
        self.assigned_counts = counts if answer.leader == answer.member_id else None
        error, mine = self._request(lambda c: c.sync(self.group, answer.generation, self.member_id, assignments,
                                                     self.rebalance_ms))
        if error != ErrorCode.none:
            logger.info("group %s: SyncGroup answered error %d", self.group, error)
            return False
        self.generation = answer.generation
        share = {(topic, p) for topic, parts in mine.items() for p in parts if topic in self.topics}
        logger.info("group %s: generation %d, member %s takes %d partitions", self.group, self.generation,
                    self.member_id, len(share))
        self._assign(share)
        return True

    def _heartbeats(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            if stop.is_set():
                return
            if self.generation < 0:  # a rejoin failed (or another thread's is under way): join
                with self._lock:
                    if stop.is_set():
                        return
                    if self.generation < 0:
                        try:
                            self.rejoin(commit=False)
                        except LogClosedError:
                            return
                        except Exception:  # noqa: BLE001 - the thread must outlive one failed rejoin
                            logger.exception("group %s: rejoining failed; trying again", self.group)
                continue
            sent = (self.generation, self.member_id)
            try:
                error = self._request(lambda c: c.heartbeat(self.group, sent[0], sent[1]))
            except LogstoreError as exc:  # the coordinator out of reach (KafkaClientError) or the store closed
                store = self._store()
                if stop.is_set() or store is None or store.closed:
                    return
                del store
                logger.info("group %s: heartbeat failed: %s", self.group, exc)
                continue
            if stop.is_set():
                continue
            if error == ErrorCode.none:
                if self._counts_changed():
                    with self._lock:
                        if stop.is_set() or (self.generation, self.member_id) != sent:
                            continue
                        logger.info("group %s: a topic's partition count changed; rebalancing", self.group)
                        try:
                            self.rejoin(commit=True)
                        except LogClosedError:
                            return
                        except Exception:  # noqa: BLE001 - the thread must outlive one failed rejoin
                            logger.exception("group %s: rejoining failed; trying again", self.group)
                            self.generation = -1
                continue
            with self._lock:
                if stop.is_set():
                    return
                if (self.generation, self.member_id) != sent:
                    continue  # answered for a generation a rejoin has replaced meanwhile
                lost = error in _REMOVED
                if error == ErrorCode.unknown_member_id:
                    self.member_id = ""
                logger.info("group %s: heartbeat answered error %d: %s", self.group, error,
                            "rejoining without committing" if lost else "rebalancing")
                try:
                    self.rejoin(commit=not lost)
                except LogClosedError:
                    return
                except Exception:  # noqa: BLE001 - the thread must outlive one failed rejoin
                    logger.exception("group %s: rejoining failed; trying again at the next heartbeat", self.group)
                    self.generation = -1

    def _counts_changed(self) -> bool:
        """As the group's leader: has a subscribed topic's partition count changed since it
        assigned (CreatePartitions, here or in another process)?"""
        counts, store = self.assigned_counts, self._store()
        if not counts or store is None:
            return False
        for topic, count in counts.items():
            try:
                if store.partitions_for(topic) != count:
                    return True
            except LogstoreError:
                return True  # deleted: the others must give it up too
        return False

    def commit(self, offsets: dict[tuple[str, int], tuple[int, str]], generation: int) -> None:
        """Commit through the coordinator as this member of ``generation`` (the one its
        records were given in).

        Raises:
            CommitFailedError: the group no longer has this member in that generation.
        """
        if not offsets:
            return
        member_id = self.member_id
        if generation < 0:
            raise CommitFailedError(f"group {self.group}: this process is rejoining the group; its partitions "
                                    "were given up")
        errors = self._request(lambda c: c.commit(self.group, generation, member_id, offsets))
        failed = {tp: e for tp, e in errors.items() if e != ErrorCode.none}
        if failed:
            if set(failed.values()) & (_REMOVED | {ErrorCode.rebalance_in_progress}):
                raise CommitFailedError(f"group {self.group}: the commit of generation {generation} was refused "
                                        f"(errors {sorted(set(failed.values()))}): the group has rebalanced")
            raise LogstoreError(f"group {self.group}: the coordinator refused the commit: {failed}")

    def leave(self) -> None:
        """Stop heartbeating and leave the group (holds the lock); its partitions go to the
        other processes at once rather than after the session timeout."""
        self._stop.set()  # the thread ends at its next wake-up, without taking the lock again
        self._thread = None
        if self.member_id and not self.store.closed:
            try:
                self._request(lambda c: c.leave(self.group, self.member_id))
            except (KafkaClientError, LogClosedError, OSError) as exc:
                logger.info("group %s: LeaveGroup failed (its session will end instead): %s", self.group, exc)
        self.member_id, self.generation, self.topics = "", -1, frozenset()
        with self._io:
            if self._client is not None:
                self._client.close()
                self._client = None
