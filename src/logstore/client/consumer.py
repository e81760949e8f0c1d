"""Consumer: reads topics of a LogStore as a member of a consumer group.

Offsets: a consumer keeps a *position* per assigned partition (the next offset it will return)
and commits positions to the internal topic ``__consumer_offsets`` (see offsets.py) with
:meth:`Consumer.commit`, automatically every ``auto_commit_interval_ms`` when
``enable_auto_commit`` (as Kafka's clients do), and when a partition is taken away from it. A
partition without a committed offset starts at ``auto_offset_reset``: "earliest" or "latest".

Groups: the consumers of a group form one group across processes, by Kafka's classic protocol.
Each store object (so each process) is one member of the group, joined through the store's own
coordinator (:mod:`logstore.client.groupservice`: served by one of the processes on a Unix socket in the
store directory, and taken over by another when that one closes or dies); the group's leader
splits the partitions among the processes with Kafka's range assignor, and a process's own
consumers of the group split its share among themselves, also by range (per topic, partitions in
order, members in join order: each gets ``n // m`` and the first ``n % m`` one more), at once
when one of them joins or closes. The group rebalances when a process joins, leaves (its last
consumer closes) or dies (its session times out, ``session_timeout_ms``; a process that died
while the group rebalances is dropped at once, its lock file tells). On a rebalance a process
gives up its partitions first, committing its positions (with auto-commit), so the new owner
continues where it stopped. A commit carries the group generation its records were given in: once
the group has moved on it raises :class:`CommitFailedError` and changes nothing. A store opened
with ``shared=False`` is one process's alone: its consumers split every partition among
themselves, with no coordinator. For work items rather than partitions, see
:class:`logstore.Queue`.

Long-poll: :meth:`Consumer.poll` returns as soon as a record is available or when its timeout
ends; while waiting it sleeps on the store's notification counter (a futex), which every append
to the store bumps, from any process.

Thread-safety: one Consumer is meant for one thread at a time (as Kafka's); its methods are
nevertheless serialised by a lock, and different consumers may be used from different threads.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterable, Iterator, NamedTuple

from ..errors import (
    CommitFailedError,
    InvalidConfigError,
    LogClosedError,
    LogstoreError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from ..groups.offsets import offset_store
from ..records.batch import Record, TimestampType

if TYPE_CHECKING:
    from .groupservice import Membership

__all__ = ["Consumer", "ConsumerRecord", "TopicPartition", "PartitionNotAssignedError", "CommitFailedError"]

logger = logging.getLogger("logstore.client.consumer")

_RESETS = ("earliest", "latest")
_member_seq = itertools.count()


class TopicPartition(NamedTuple):
    """A (topic, partition) pair."""

    topic: str
    partition: int


class ConsumerRecord(NamedTuple):
    """A record as a consumer returns it: where it came from, then the record's fields."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: TimestampType
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


class PartitionNotAssignedError(LogstoreError, ValueError):
    """An operation named a partition this consumer is not assigned."""


class _Group:
    """The members of one consumer group in this store object, and their range assignment of
    the partitions the group gives this store object: every partition of their topics, or with
    a shared store this process's share of the cross-process group (:mod:`logstore.client.groupservice`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.RLock()
        self.members: dict[str, "Consumer"] = {}
        #: each member's ``revoke(partitions, commit=True)``: how it gives partitions up
        self.revokers: dict[str, Callable[..., None]] = {}
        #: (generation, assignment by member id, the cross-process group's generation it comes
        #: from), replaced as a whole by each rebalance so that members read it without the lock.
        self.state: tuple[int, dict[str, list[TopicPartition]], int] = (0, {}, -1)
        self.membership: Membership | None = None
        #: the partitions the cross-process group gave this store object (None: not shared)
        self.share: set[tuple[str, int]] | None = None
        #: not shared: the partition counts the last rebalance split (a grown topic rebalances)
        self.counts: dict[str, int] = {}

    def topics(self) -> frozenset[str]:
        return frozenset(t for m in self.members.values() for t in m.subscription)

    def join(self, member: "Consumer", revoke: Callable[..., None]) -> None:
        """Add ``member``, which gives partitions up through ``revoke`` (called holding the lock)."""
        with self.lock:
            self.members[member.member_id] = member
            self.revokers[member.member_id] = revoke
            if member.store.shared:
                if self.membership is None:
                    from .groupservice import Membership  # the group client: loaded by the first shared group

                    self.share = set()
                    self.membership = Membership(member.store, self.name, self.lock, self._give_up, self._take,
                                                 member.session_timeout_ms, member.heartbeat_interval_ms)
                try:
                    self.membership.subscribe(self.topics())  # a (re)join calls _take, which rebalances
                except BaseException:
                    del self.members[member.member_id]
                    del self.revokers[member.member_id]
                    raise
            self._rebalance(member.store)

    def leave(self, member: "Consumer") -> None:
        with self.lock:
            if self.members.pop(member.member_id, None) is None:
                return
            del self.revokers[member.member_id]
            if self.membership is not None:
                if not self.members:
                    self.membership.leave()
                    self.share = set()
                elif not member.store.closed:
                    self.membership.subscribe(self.topics())
            self._rebalance(member.store)

    def commit(self, store: Any, offsets: dict[TopicPartition, int], generation: int) -> None:
        """Commit for the group: through the coordinator with the cross-process group's
        ``generation`` that the records were given in when the store is shared, else straight
        to ``__consumer_offsets``."""
        if self.membership is not None:
            self.membership.commit({tp: (offset, "") for tp, offset in offsets.items()}, generation)
        else:
            offset_store(store).commit(self.name, offsets)

    def _give_up(self, commit: bool) -> None:
        """The membership gives up every partition (it rejoins); with the lock held."""
        self.share = set()
        if self.members:
            self._rebalance(next(iter(self.members.values())).store, commit)

    def _take(self, share: set[tuple[str, int]]) -> None:
        """The membership's new share; with the lock held."""
        self.share = share
        if self.members:
            self._rebalance(next(iter(self.members.values())).store)

    def check_counts(self, store: Any) -> None:
        """Not shared: rebalance when a subscribed topic's partition count changed since the
        last split (CreatePartitions), as a Kafka consumer does on its metadata refresh. (A
        shared group's leader checks in its heartbeats: Membership.)"""
        if self.share is not None or not self.members:
            return
        with self.lock:
            try:
                changed = any(store.partitions_for(t) != n for t, n in self.counts.items())
            except LogstoreError:
                return  # a topic deleted: its consumers' reads say so
            if changed:
                self._rebalance(store)

    def _rebalance(self, store: Any, commit: bool = True) -> None:
        new: dict[str, list[TopicPartition]] = {m: [] for m in self.members}
        topics = sorted({t for m in self.members.values() for t in m.subscription})
        self.counts = {}
        for topic in topics:
            subscribers = [mid for mid, m in self.members.items() if topic in m.subscription]
            if self.share is None:
                self.counts[topic] = store.partitions_for(topic)
                partitions = list(range(self.counts[topic]))
            else:
                partitions = sorted(p for t, p in self.share if t == topic)
            per, extra = divmod(len(partitions), len(subscribers))
            start = 0
            for i, mid in enumerate(subscribers):
                n = per + (1 if i < extra else 0)
                new[mid].extend(TopicPartition(topic, p) for p in partitions[start:start + n])
                start += n
        # Two steps, so that no partition ever has two owners and positions are committed before
        # anyone takes a partition over: first publish the old assignment minus what moves and
        # let the losers commit, then publish the new assignment.
        generation, old, _ = self.state
        member_generation = self.membership.generation if self.membership is not None else -1
        kept = {mid: [tp for tp in old.get(mid, ()) if tp in set(new[mid])] for mid in self.members}
        self.state = (generation + 1, kept, member_generation)
        for mid in self.members:
            revoked = set(old.get(mid, ())) - set(new[mid])
            if revoked:
                if commit:
                    self.revokers[mid](revoked)
                else:
                    self.revokers[mid](revoked, commit=False)
        self.state = (generation + 2, new, member_generation)


_GROUPS: "weakref.WeakKeyDictionary[Any, dict[str, _Group]]" = weakref.WeakKeyDictionary()
_GROUPS_LOCK = threading.Lock()


def _group(store: Any, name: str) -> _Group:
    with _GROUPS_LOCK:
        groups = _GROUPS.setdefault(store, {})
        group = groups.get(name)
        if group is None:
            group = groups[name] = _Group(name)
        return group


class Consumer:
    """A member of consumer group ``group`` reading ``topics`` of a LogStore. Use
    ``store.consumer(group, topics, ...)``.

    Args:
        store: the LogStore.
        group: the group id (committed offsets are kept per group).
        topics: a topic name or an iterable of them.
        auto_offset_reset: "earliest" or "latest": where to start without a committed offset
            (and after an offset fell out of range).
        enable_auto_commit: commit positions every ``auto_commit_interval_ms`` during poll,
            on rebalance and on close.
        max_poll_records: the most records one poll returns.
        fetch_max_bytes: bytes read per partition per fetch.
        session_timeout_ms, heartbeat_interval_ms: with a shared store (the default), how long
            the group waits for a silent process before giving its partitions to the others,
            and how often this process tells it that it lives (Kafka's consumer settings; the
            first consumer of the group in this store object sets them).
        isolation_level: "read_uncommitted" (Kafka's default: every record below the high
            watermark) or "read_committed" (records of transactions only once committed, never
            those of aborted ones; reads stop at the last stable offset, and "latest", the end
            and the lag count from it).

    Durability: commits are fsynced before :meth:`commit` returns.
    """

    def __init__(self, store: Any, group: str, topics: str | Iterable[str], *,
                 auto_offset_reset: str = "earliest", enable_auto_commit: bool = True,
                 auto_commit_interval_ms: int = 5000, max_poll_records: int = 500,
                 fetch_max_bytes: int = 1 << 20, session_timeout_ms: int = 10_000,
                 heartbeat_interval_ms: int = 1_000, isolation_level: str = "read_uncommitted") -> None:
        if not isinstance(group, str) or not group:
            raise InvalidConfigError(f"group must be a non-empty str, got {group!r}")
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise InvalidConfigError(f"isolation_level must be 'read_uncommitted' or 'read_committed', "
                                     f"got {isolation_level!r}")
        if auto_offset_reset not in _RESETS:
            raise InvalidConfigError(f"auto_offset_reset must be 'earliest' or 'latest', got {auto_offset_reset!r}")
        if isinstance(max_poll_records, bool) or not isinstance(max_poll_records, int) or max_poll_records < 1:
            raise InvalidConfigError(f"max_poll_records must be a positive int, got {max_poll_records!r}")
        for name, value in (("session_timeout_ms", session_timeout_ms), ("heartbeat_interval_ms", heartbeat_interval_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidConfigError(f"{name} must be a positive int, got {value!r}")
        if heartbeat_interval_ms >= session_timeout_ms:
            raise InvalidConfigError(f"heartbeat_interval_ms ({heartbeat_interval_ms}) must be below "
                                     f"session_timeout_ms ({session_timeout_ms})")
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names:
            raise InvalidConfigError("a consumer needs at least one topic")
        for name in names:
            store.partitions_for(name)  # unknown or invalid topic: raise now
        self.store = store
        self.group = group
        self.subscription = frozenset(names)
        self.auto_offset_reset = auto_offset_reset
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_s = auto_commit_interval_ms / 1000.0
        self.max_poll_records = max_poll_records
        self.fetch_max_bytes = fetch_max_bytes
        self.isolation_level = isolation_level
        self._committed_only = isolation_level == "read_committed"
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.member_id = f"{group}-{next(_member_seq):08d}-{uuid.uuid4().hex[:8]}"
        self._lock = threading.RLock()
        self._offsets = offset_store(store)
        self._positions: dict[TopicPartition, int] = {}
        self._assigned: list[TopicPartition] = []
        self._generation = -1
        self._member_generation = -1  # the cross-process group's generation of the assignment
        self._next = 0
        self._last_commit = time.monotonic()
        self._closed = False
        self._group = _group(store, group)
        # The group gives this member's partitions up through _revoke, looked up at each call.
        self._group.join(self, lambda *args, **kwargs: self._revoke(*args, **kwargs))

    # ------------------------------------------------------------------ assignment
    def _sync(self) -> None:
        """Pick up the group's current assignment (holds the lock)."""
        if self._closed:
            raise LogClosedError(f"consumer {self.member_id} is closed")
        generation, assignment, member_generation = self._group.state
        if generation == self._generation:
            return
        assigned = list(assignment.get(self.member_id, ()))
        self._generation = generation
        self._member_generation = member_generation
        for tp in list(self._positions):
            if tp not in assigned:
                del self._positions[tp]
        self._assigned = assigned
        for tp in assigned:
            if tp not in self._positions:
                self._positions[tp] = self._initial_position(tp)

    def _initial_position(self, tp: TopicPartition) -> int:
        committed = self._offsets.committed(self.group, tp.topic, tp.partition)
        log = self.store.partition(tp.topic, tp.partition)
        if committed is not None and log.log_start_offset <= committed <= log.log_end_offset:
            return committed
        return self._reset_position(tp)

    def _reset_position(self, tp: TopicPartition) -> int:
        log = self.store.partition(tp.topic, tp.partition)
        return log.log_start_offset if self.auto_offset_reset == "earliest" else self._end_of(log)

    def _end_of(self, log: Any) -> int:
        """Where this consumer's view of the log ends: the last stable offset (read_committed)
        or the high watermark."""
        return log.last_stable_offset if self._committed_only else log.high_watermark

    def _revoke(self, partitions: set[TopicPartition], commit: bool = True) -> None:
        """Called by the group on a rebalance (from the joining or leaving thread, or the
        heartbeat thread): with auto-commit, commit the positions (unless the group already
        dropped this process: ``commit`` False), then forget the partitions."""
        with self._lock:
            mine = {tp: self._positions[tp] for tp in partitions if tp in self._positions}
            if self.enable_auto_commit and commit and mine and not self._closed:
                self._commit_quietly(mine, "on a rebalance")
            for tp in partitions:
                self._positions.pop(tp, None)
            self._assigned = [tp for tp in self._assigned if tp not in partitions]

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member currently reads."""
        with self._lock:
            self._sync()
            return set(self._assigned)

    # ------------------------------------------------------------------ reading
    def poll(self, timeout: float = 0.0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Return the next records (at most ``max_records``, default max_poll_records), waiting up
        to ``timeout`` seconds for the first one. Returns [] on timeout. Advances positions.

        Raises:
            LogClosedError: the consumer or the store is closed.
        """
        return self.store.wait_until_done(self._attempts(timeout, max_records, time.monotonic))  # type: ignore[no-any-return]

    def _attempts(self, timeout: float, max_records: int | None,
                  clock: Any) -> Generator[tuple[int, float], None, list[ConsumerRecord]]:
        """The poll loop without its way of waiting: fetches, and when nothing is there yields
        (notification counter, seconds left) and fetches again; returns the records."""
        limit = self.max_poll_records if max_records is None else max_records
        deadline = clock() + max(0.0, timeout)
        while True:
            seen = self.store.notification()
            records = self._fetch(limit)
            if records:
                return records
            remaining = deadline - clock()
            if remaining <= 0:
                return []
            yield seen, remaining

    def _fetch(self, limit: int) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        self._group.check_counts(self.store)
        with self._lock:
            self._sync()
            self._maybe_auto_commit()
            assigned = self._assigned
            n = len(assigned)
            for i in range(n):
                if len(out) >= limit:
                    break
                tp = assigned[(self._next + i) % n]
                records = self._read(tp, limit - len(out))
                if records:
                    topic, partition = tp
                    make = ConsumerRecord._make
                    prefix = (topic, partition)
                    out.extend([make(prefix + r) for r in records])
                    self._positions[tp] = records[-1].offset + 1
            if n:
                self._next = (self._next + 1) % n
        return out

    def _read(self, tp: TopicPartition, limit: int) -> list[Record]:
        log = self.store.partition(tp.topic, tp.partition)
        position = self._positions[tp]
        for _ in range(2):
            hw = self._end_of(log)
            try:
                records = log.read(position, max_bytes=self.fetch_max_bytes, max_records=limit, max_offset=hw,
                                   isolation_level=self.isolation_level)
            except OffsetOutOfRangeError:
                position = self._positions[tp] = self._reset_position(tp)
                continue
            if not records and position < hw <= log.log_end_offset:
                # Nothing but control batches, aborted or compacted-away records below the high
                # watermark (or LSO): move past them, or the next poll would find "new" data again.
                self._positions[tp] = hw
            return records
        return []

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Yield records forever (polling with a 1 s timeout) until the consumer is closed."""
        while not self._closed:
            try:
                records = self.poll(1.0)
            except LogClosedError:
                return
            yield from records

    async def apoll(self, timeout: float = 0.0, max_records: int | None = None) -> list[ConsumerRecord]:
        """:meth:`poll` for asyncio: fetching runs on the event loop (reads of the page cache),
        waiting runs in the default executor, so the loop is never blocked. Cancelling it loses
        nothing: positions move only when records are returned."""
        import asyncio  # loaded by whoever runs this coroutine; not by importing the consumer

        loop = asyncio.get_running_loop()
        return await self.store.await_until_done(self._attempts(timeout, max_records, loop.time))  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ positions
    def _check_assigned(self, topic: str, partition: int) -> TopicPartition:
        self._sync()
        tp = TopicPartition(topic, partition)
        if tp not in self._positions:
            raise PartitionNotAssignedError(f"{topic}-{partition} is not assigned to consumer {self.member_id}")
        return tp

    def position(self, topic: str, partition: int) -> int:
        """The offset the next record returned from this partition will have."""
        with self._lock:
            return self._positions[self._check_assigned(topic, partition)]

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Continue reading the partition at ``offset`` (out-of-range offsets are reset by
        auto_offset_reset at the next read)."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        with self._lock:
            self._positions[self._check_assigned(topic, partition)] = offset

    def seek_to_beginning(self, *partitions: tuple[str, int]) -> None:
        """Continue each given partition (default: all assigned) at its log start offset."""
        with self._lock:
            self._sync()
            for tp in partitions or tuple(self._assigned):
                tp = self._check_assigned(*tp)
                self._positions[tp] = self.store.partition(*tp).log_start_offset

    def seek_to_end(self, *partitions: tuple[str, int]) -> None:
        """Continue each given partition (default: all assigned) at its high watermark (its
        last stable offset with read_committed)."""
        with self._lock:
            self._sync()
            for tp in partitions or tuple(self._assigned):
                tp = self._check_assigned(*tp)
                self._positions[tp] = self._end_of(self.store.partition(*tp))

    def seek_to_timestamp(self, timestamp: int, *partitions: tuple[str, int]) -> dict[TopicPartition, int]:
        """Move to the first record with timestamp >= ``timestamp`` (the log end if none) in the
        given partitions (default: all assigned); returns the new positions."""
        moved = {}
        with self._lock:
            self._sync()
            for tp in partitions or tuple(self._assigned):
                tp = self._check_assigned(*tp)
                log = self.store.partition(*tp)
                found = log.offset_for_timestamp(timestamp)
                self._positions[tp] = moved[tp] = self._end_of(log) if found is None else found
        return moved

    def lag(self) -> dict[TopicPartition, int]:
        """Records between each assigned partition's position and its high watermark."""
        with self._lock:
            self._sync()
            return {tp: max(0, self._end_of(self.store.partition(*tp)) - pos) for tp, pos in self._positions.items()}

    # ------------------------------------------------------------------ commits
    def commit(self, offsets: dict[tuple[str, int], int] | None = None) -> None:
        """Commit ``offsets`` (default: the current positions of every assigned partition).

        Durability: fsynced on return; committed offsets survive a crash of the process or the
        machine. A commit is one batch: all of its partitions are committed, or none.

        Raises:
            CommitFailedError: (shared stores) the group rebalanced and this process's
                generation is over: its partitions may be another process's now.
        """
        with self._lock:
            given_in = self._member_generation
            self._sync()
            # Records given in a generation that is over (or given up for a rejoin) cannot be
            # committed; positions taken up afresh since then (from committed offsets) can.
            if self._member_generation != given_in and self._group.membership is not None and given_in >= 0:
                raise CommitFailedError(f"group {self.group}: the group rebalanced (generation {given_in} -> "
                                        f"{self._member_generation}) since this consumer's records were given: "
                                        "their partitions may be another process's now")
            to_commit: dict[TopicPartition, int]
            if offsets is None:
                to_commit = dict(self._positions)
            else:
                to_commit = {}
                for (topic, partition), off in offsets.items():
                    count = self.store.partitions_for(topic)
                    if partition.__class__ is not int or not 0 <= partition < count:
                        raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition!r}")
                    to_commit[TopicPartition(topic, partition)] = off
            self._group.commit(self.store, to_commit, self._member_generation)
            self._last_commit = time.monotonic()

    def _commit_quietly(self, positions: dict[TopicPartition, int], when: str) -> None:
        """An automatic commit: refused because the group rebalanced, it is logged (the
        partitions' new owners start from the last commit), not raised."""
        try:
            self._group.commit(self.store, positions, self._member_generation)
        except LogstoreError as exc:  # CommitFailedError, or the coordinator out of reach
            logger.warning("consumer %s: auto-commit %s failed: %s", self.member_id, when, exc)

    def _maybe_auto_commit(self) -> None:
        if self.enable_auto_commit and time.monotonic() - self._last_commit >= self.auto_commit_interval_s:
            if self._positions:
                self._commit_quietly(dict(self._positions), "by interval")
            self._last_commit = time.monotonic()

    def committed(self, topic: str, partition: int) -> int | None:
        """The group's committed offset for the partition (assigned or not), or None."""
        return self._offsets.committed(self.group, topic, partition)

    # ------------------------------------------------------------------ closing
    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._closed

    def close(self) -> None:
        """Commit positions (with auto-commit), leave the group (its partitions go to the other
        members) and stop. Idempotent."""
        with self._lock:
            if self._closed:
                return
            try:
                if self.enable_auto_commit and self._positions and not self.store.closed:
                    self._commit_quietly(dict(self._positions), "on close")
            finally:
                self._closed = True
                self._positions.clear()
        self._group.leave(self)

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Consumer({self.group!r}, {sorted(self.subscription)}, member={self.member_id})"
