"""Queue: a durable at-least-once work queue on a topic, shared by threads and processes.

Messages are records of the topic ``name``. Which of them are delivered, acknowledged, waiting
for redelivery or dead is kept in a second, internal topic ``__queue.<name>`` as a log of small
operation records, replayed and then followed by every process that opens the queue:

* ``L`` lease: message (partition, offset) handed to a consumer, its delivery count and the
  deadline (now + visibility_timeout) after which it is handed out again;
* ``A`` ack: done, never delivered again;
* ``N`` nack: hand it out again from a given time;
* ``D`` dead: moved to the dead-letter topic after max_deliveries;
* ``S`` snapshot: the whole state (per partition: the *floor* below which every message is done,
  the *cursor* below which every message has been delivered at least once, the done offsets
  above the floor as ranges, and the leases and pending redeliveries). After a snapshot, older
  operations are deleted (``delete_records_before``), so the state log stays short.

A get or an ack reads the operations other processes appended since it last looked, decides,
and appends its own, all while holding the state log's writers' lock (``Log.exclusive``), so
two consumers — in one process or several — never lease the same message at once. The byte
layout of the operations is in FORMAT.md.

Guarantees: a message whose :meth:`Queue.put` returned with durability "fsynced" survives power
loss; every message is delivered until acknowledged or dead-lettered (at least once); an
acknowledged message is never delivered again after a restart of the process (acks are in the
page cache when ack() returns; with ``ack_durability="fsynced"`` they also survive power loss).

Thread-safety: a Queue may be shared by threads; several processes may open the same queue.
"""

from __future__ import annotations

import heapq
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generator, Iterable

from ..errors import InvalidConfigError, LogClosedError, OffsetOutOfRangeError, CorruptRecordError
from .producer import RecordMetadata, default_partition
from ..records.batch import NO_HEADERS, Record, TimestampType
from ..store.store import LogStore

if TYPE_CHECKING:
    import asyncio

__all__ = ["Queue", "Message"]

logger = logging.getLogger("logstore.queue")

_LEASE = struct.Struct(">ciqiq")      # op, partition, offset, delivery count, deadline ms
_ACK = struct.Struct(">ciq")          # op (A or D), partition, offset
_NACK = struct.Struct(">ciqiq")       # op, partition, offset, delivery count, available at ms
_SNAP_HEAD = struct.Struct(">cbi")    # op, version, partitions
_SNAP_PART = struct.Struct(">qqi")    # floor, cursor, done ranges
_RANGE = struct.Struct(">qq")
_COUNT = struct.Struct(">i")
_INFLIGHT = struct.Struct(">iqqiq")   # partition, offset, deadline, count, lease (state offset)
_RETRY = struct.Struct(">iqqi")       # partition, offset, available at, count
_SNAPSHOT_EVERY = 20_000
_RECENT_PUTS = 4096
_STATE_CONFIG = dict(segment_bytes=128 << 20, max_message_bytes=64 << 20, retention_ms=-1, retention_bytes=-1)
_now_ms = lambda: time.time_ns() // 1_000_000  # noqa: E731


@dataclass(slots=True)
class Message:
    """One delivery of a queued message. Acknowledge it with :meth:`Queue.ack` (or ``msg.ack()``)."""

    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp: int
    partition: int
    offset: int
    #: 1 for the first delivery, then 2, 3, ...
    delivery_count: int
    #: identifies this delivery (the offset of its lease in the state log)
    lease: int
    _queue: "Queue | None" = field(default=None, repr=False, compare=False)

    def ack(self) -> None:
        """Acknowledge this delivery (Queue.ack)."""
        assert self._queue is not None
        self._queue.ack(self)

    def nack(self, delay: float = 0.0) -> None:
        """Give this delivery back for redelivery after ``delay`` seconds (Queue.nack)."""
        assert self._queue is not None
        self._queue.nack(self, delay)


class _Partition:
    __slots__ = ("floor", "cursor", "done")

    def __init__(self, floor: int = 0, cursor: int = 0) -> None:
        self.floor = floor
        self.cursor = cursor
        self.done: set[int] = set()

    def mark_done(self, offset: int) -> None:
        if offset < self.floor:
            return
        self.done.add(offset)
        while self.floor in self.done:
            self.done.discard(self.floor)
            self.floor += 1


class _State:
    """The delivery state, as the state log describes it up to ``position``."""

    def __init__(self, partitions: int) -> None:
        self.partitions = [_Partition() for _ in range(partitions)]
        self.inflight: dict[tuple[int, int], tuple[int, int, int]] = {}  # (deadline, count, lease)
        self.retry: dict[tuple[int, int], tuple[int, int]] = {}          # (available at, count)
        self.due: list[tuple[int, int, int]] = []                         # heap of (time, partition, offset)
        self.position = 0
        self.since_snapshot = 0

    def apply(self, offset: int, value: bytes) -> None:
        """Apply the operation read at state log ``offset``."""
        try:
            self._apply(offset, value)
        except struct.error:
            raise CorruptRecordError(None, None, f"queue state operation {value[:1]!r} at offset {offset} "
                                     f"has a bad length ({len(value)} bytes)") from None

    def _apply(self, offset: int, value: bytes) -> None:
        op = value[:1]
        if op == b"L":
            _, p, off, count, deadline = _LEASE.unpack(value)
            self._check(offset, op, p, off)
            self.lease(offset, p, off, count, deadline)
            return
        if op in (b"A", b"D"):
            _, p, off = _ACK.unpack(value)
            self._check(offset, op, p, off)
            self.done(p, off)
            return
        if op == b"N":
            _, p, off, count, available = _NACK.unpack(value)
            self._check(offset, op, p, off)
            if (p, off) in self.inflight:
                del self.inflight[(p, off)]
                self.retry[(p, off)] = (available, count)
                heapq.heappush(self.due, (available, p, off))
        elif op == b"S":
            self.load_snapshot(value)
        else:
            raise CorruptRecordError(None, None, f"queue state operation {op!r} at offset {offset} is unknown")
        self.since_snapshot += 1

    def _check(self, offset: int, op: bytes, p: int, off: int) -> None:
        if not 0 <= p < len(self.partitions) or off < 0:
            raise CorruptRecordError(None, None, f"queue state operation {op!r} at offset {offset} names message "
                                     f"{p}-{off}, outside the queue's {len(self.partitions)} partition(s)")

    def lease(self, offset: int, p: int, off: int, count: int, deadline: int) -> None:
        """Apply an ``L`` operation written at state log ``offset``."""
        key = (p, off)
        if self.retry:
            self.retry.pop(key, None)
        self.inflight[key] = (deadline, count, offset)
        part = self.partitions[p]
        if off >= part.cursor:
            part.cursor = off + 1
        due = self.due
        heapq.heappush(due, (deadline, p, off))
        if len(due) > 2 * (len(self.inflight) + len(self.retry)) + 4096:
            self._rebuild_due()  # drop entries of acked deliveries: memory stays O(in flight)
        self.since_snapshot += 1

    def _rebuild_due(self) -> None:
        self.due = [(d, p, off) for (p, off), (d, _, _) in self.inflight.items()]
        self.due.extend((a, p, off) for (p, off), (a, _) in self.retry.items())
        heapq.heapify(self.due)

    def done(self, p: int, off: int) -> None:
        """Apply an ``A`` or ``D`` operation."""
        key = (p, off)
        self.inflight.pop(key, None)
        if self.retry:
            self.retry.pop(key, None)
        part = self.partitions[p]
        if off == part.floor and not part.done:
            part.floor = off + 1  # (the common case: acks in order)
        else:
            part.mark_done(off)
        if off >= part.cursor:
            part.cursor = off + 1
        self.since_snapshot += 1

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> bytes:
        out = [_SNAP_HEAD.pack(b"S", 1, len(self.partitions))]
        for part in self.partitions:
            ranges = _ranges(part.done)
            out.append(_SNAP_PART.pack(part.floor, part.cursor, len(ranges)))
            out.extend(_RANGE.pack(a, b) for a, b in ranges)
        out.append(_COUNT.pack(len(self.inflight)))
        out.extend(_INFLIGHT.pack(p, off, d, c, lease) for (p, off), (d, c, lease) in self.inflight.items())
        out.append(_COUNT.pack(len(self.retry)))
        out.extend(_RETRY.pack(p, off, a, c) for (p, off), (a, c) in self.retry.items())
        return b"".join(out)

    def load_snapshot(self, data: bytes) -> None:
        try:
            _, version, n = _SNAP_HEAD.unpack_from(data, 0)
            if version != 1 or n != len(self.partitions):
                raise CorruptRecordError(None, None, f"queue snapshot version {version} with {n} partitions "
                                         f"(expected version 1 with {len(self.partitions)})")
            pos = _SNAP_HEAD.size
            for part in self.partitions:
                part.floor, part.cursor, nranges = _SNAP_PART.unpack_from(data, pos)
                pos += _SNAP_PART.size
                part.done = set()
                for _ in range(nranges):
                    a, b = _RANGE.unpack_from(data, pos)
                    pos += _RANGE.size
                    if not part.floor <= a < b or b - a > 1 << 32:
                        raise CorruptRecordError(None, None, "queue snapshot has a bad done range")
                    part.done.update(range(a, b))
            (count,) = _COUNT.unpack_from(data, pos)
            pos += _COUNT.size
            self.inflight = {}
            self.retry = {}
            self.due = []
            for _ in range(count):
                p, off, d, c, lease = _INFLIGHT.unpack_from(data, pos)
                pos += _INFLIGHT.size
                self.inflight[(p, off)] = (d, c, lease)
                self.due.append((d, p, off))
            (count,) = _COUNT.unpack_from(data, pos)
            pos += _COUNT.size
            for _ in range(count):
                p, off, a, c = _RETRY.unpack_from(data, pos)
                pos += _RETRY.size
                self.retry[(p, off)] = (a, c)
                self.due.append((a, p, off))
            heapq.heapify(self.due)
        except struct.error as exc:
            raise CorruptRecordError(None, None, f"queue snapshot is truncated: {exc}") from None
        self.since_snapshot = 0

    def next_due(self, now: int) -> tuple[int, int, int] | None:
        """Pop the earliest (partition, offset, count) whose lease expired or retry time came."""
        due = self.due
        while due and due[0][0] <= now:
            when, p, off = heapq.heappop(due)
            lease = self.inflight.get((p, off))
            if lease is not None and lease[0] == when:
                return p, off, lease[1]
            retry = self.retry.get((p, off))
            if retry is not None and retry[0] == when:
                return p, off, retry[1]
        return None

    def next_time(self) -> int | None:
        return self.due[0][0] if self.due else None


def _ranges(offsets: set[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for off in sorted(offsets):
        if out and out[-1][1] == off:
            out[-1] = (out[-1][0], off + 1)
        else:
            out.append((off, off + 1))
    return out


class Queue:
    """A durable at-least-once work queue named ``name`` in the store at ``root``.

    Args:
        root: a data directory (the Queue opens and owns a LogStore there) or a LogStore.
        name: the queue's topic.
        partitions: partitions of the topic when the queue is created.
        visibility_timeout: seconds a delivered message stays invisible to other consumers; not
            acknowledged by then, it is delivered again.
        max_deliveries: after this many deliveries without ack a message goes to the
            dead-letter topic instead of being delivered again (None: never).
        dead_letter_topic: default ``<name>.dlq``.
        durability: of put(): "fsynced" (default; concurrent puts share fsyncs) or "written".
        ack_durability: of ack()/nack(): "written" (default; survives the process) or "fsynced".
        **topic_config: LogConfig settings for the topic when it is created.

    Thread-safe; process-safe (open the same root and name in every worker process).
    """

    def __init__(self, root: str | os.PathLike[str] | LogStore, name: str, *, partitions: int = 1,
                 visibility_timeout: float = 30.0, max_deliveries: int | None = None,
                 dead_letter_topic: str | None = None, durability: str = "fsynced",
                 ack_durability: str = "written", **topic_config: Any) -> None:
        if durability not in ("written", "fsynced") or ack_durability not in ("written", "fsynced"):
            raise InvalidConfigError(f"durability and ack_durability must be 'written' or 'fsynced', "
                                     f"got {durability!r} and {ack_durability!r}")
        if not isinstance(visibility_timeout, (int, float)) or isinstance(visibility_timeout, bool) or visibility_timeout <= 0:
            raise InvalidConfigError(f"visibility_timeout must be a positive number of seconds, got {visibility_timeout!r}")
        if max_deliveries is not None and (isinstance(max_deliveries, bool) or not isinstance(max_deliveries, int)
                                           or max_deliveries < 1):
            raise InvalidConfigError(f"max_deliveries must be a positive int or None, got {max_deliveries!r}")
        self.store: LogStore
        if isinstance(root, LogStore):
            self.store, self._owns_store = root, False
        else:
            self.store, self._owns_store = LogStore(root), True
        try:
            self.name = name
            self.visibility_ms = int(visibility_timeout * 1000)
            self.max_deliveries = max_deliveries
            self.dead_letter_topic = dead_letter_topic or f"{name}.dlq"
            self.fsync_puts = durability == "fsynced"
            self.fsync_acks = ack_durability == "fsynced"
            self.store.create_topic(name, partitions, exist_ok=True, **topic_config)
            self.store.create_topic(f"__queue.{name}", 1, exist_ok=True, internal=True, **_STATE_CONFIG)
            if max_deliveries is not None:
                self.store.create_topic(self.dead_letter_topic, 1, exist_ok=True)
            self.partitions = self.store.partitions_for(name)
            self._logs = [self.store.partition(name, p) for p in range(self.partitions)]
            self._state_log = self.store.partition(f"__queue.{name}", 0)
        except BaseException:
            if self._owns_store:
                self.store.close()
            raise
        self._state = _State(self.partitions)
        # The state log's exclusive() serialises threads of this process and, for a shared
        # store, other processes: it is the one lock around the delivery state.
        self._exclusive = self._state_log.exclusive()
        self._next_partition = 0
        self._cache: dict[int, list[Record]] = {}
        self._recent: dict[tuple[int, int], Record] = {}
        self._recent_lock = threading.Lock()
        self._flushers: dict[tuple[Any, int], _AsyncFlusher] = {}
        # Own puts are remembered only where the log keeps the producer's timestamp.
        self._stamp_puts = all(log.config.message_timestamp_type == "CreateTime" for log in self._logs)
        self._closed = False

    # ------------------------------------------------------------------ producing
    def put(self, value: bytes | None, key: bytes | None = None,
            headers: Iterable[tuple[str, bytes | None]] = ()) -> RecordMetadata:
        """Add a message; return where it was written. Durable per ``durability`` on return
        (with "fsynced", concurrent puts share one fsync)."""
        log, meta = self._append(value, key, headers)
        if self.fsync_puts:
            log.flush()
        return meta

    async def aput(self, value: bytes | None, key: bytes | None = None,
                   headers: Iterable[tuple[str, bytes | None]] = ()) -> RecordMetadata:
        """:meth:`put` for asyncio. The append happens at once; with durability "fsynced" the
        coroutine then waits for an fsync run in the default executor and shared by every
        coroutine that appended before it started (group commit without a thread per caller)."""
        log, meta = self._append(value, key, headers)
        if self.fsync_puts:
            await self._async_flusher(meta.partition).wait()
        return meta

    def _async_flusher(self, partition: int) -> "_AsyncFlusher":
        import asyncio  # loaded by the coroutine's caller; not by importing the queue

        loop = asyncio.get_running_loop()
        flusher = self._flushers.get((loop, partition))
        if flusher is None:
            flusher = self._flushers[(loop, partition)] = _AsyncFlusher(self._logs[partition], loop)
        return flusher

    def _append(self, value: bytes | None, key: bytes | None,
                headers: Iterable[tuple[str, bytes | None]]) -> tuple[Any, RecordMetadata]:
        log = self._log_for(key)
        if headers:
            headers = list(headers)
        if self._stamp_puts:
            ts = time.time_ns() // 1_000_000
            offset = log.append(value, key, headers, timestamp=ts)
            self._remember(log.partition, Record(offset, ts, TimestampType.CREATE_TIME, key, value,
                                                 list(headers) if headers else NO_HEADERS))
        else:
            offset = log.append(value, key, headers)
        return log, RecordMetadata(log.partition, offset)

    def _remember(self, partition: int, record: Record) -> None:
        """Keep what this process put for a while: a get of it (often soon, by a worker thread of
        the same process) then needs no read of the log."""
        recent = self._recent
        with self._recent_lock:
            recent[(partition, record.offset)] = record
            if len(recent) > _RECENT_PUTS:
                del recent[next(iter(recent))]

    def put_many(self, values: list[bytes | None], keys: list[bytes | None] | None = None) -> list[RecordMetadata]:
        """Add messages as one batch per partition with one fsync each; return where each went."""
        if keys is not None and len(keys) != len(values):
            raise ValueError("keys and values differ in length")
        groups: dict[int, list[int]] = {}
        for i in range(len(values)):
            key = keys[i] if keys is not None else None
            p = default_partition(key, self.partitions) if key is not None else self._round_robin()
            groups.setdefault(p, []).append(i)
        out: list[RecordMetadata | None] = [None] * len(values)
        for p, idx in groups.items():
            log = self._logs[p]
            first = log.append_batch([values[i] for i in idx], None if keys is None else [keys[i] for i in idx])
            if self.fsync_puts:
                log.flush()
            for j, i in enumerate(idx):
                out[i] = RecordMetadata(p, first + j)
        return out  # type: ignore[return-value]

    def _round_robin(self) -> int:
        p = self._next_partition % self.partitions
        self._next_partition += 1
        return p

    def _log_for(self, key: bytes | None) -> Any:
        if self.partitions == 1:
            return self._logs[0]
        if key is not None:
            return self._logs[default_partition(key, self.partitions)]
        return self._logs[self._round_robin()]

    # ------------------------------------------------------------------ state log
    def _catch_up(self) -> None:
        """Apply operations other processes appended (inside ``state_log.exclusive()``)."""
        state = self._state
        log = self._state_log
        end = log.log_end_offset
        while state.position < end:
            try:
                records = log.read(state.position, max_offset=end)
            except OffsetOutOfRangeError as exc:
                # A snapshot moved the start past us: the start is that snapshot.
                state.position = exc.log_start_offset
                continue
            if not records:
                state.position = end
                break
            for r in records:
                if r.value is not None:
                    state.apply(r.offset, r.value)
            state.position = records[-1].offset + 1

    def _write(self, value: bytes) -> int:
        """Append one operation and apply it (inside ``state_log.exclusive()``)."""
        offset = self._state_log.append(value)
        self._state.apply(offset, value)
        self._state.position = offset + 1
        return offset

    def _write_lease(self, p: int, off: int, count: int, deadline: int) -> int:
        """_write of an ``L`` operation, applied without decoding it again."""
        offset = self._state_log.append(_LEASE.pack(b"L", p, off, count, deadline))
        state = self._state
        state.lease(offset, p, off, count, deadline)
        state.position = offset + 1
        return offset

    def _write_done(self, op: bytes, p: int, off: int) -> None:
        """_write of an ``A`` (ack) or ``D`` (dead) operation."""
        offset = self._state_log.append(_ACK.pack(op, p, off))
        state = self._state
        state.done(p, off)
        state.position = offset + 1

    def _maybe_snapshot(self) -> None:
        state = self._state
        if state.since_snapshot < _SNAPSHOT_EVERY:
            return
        try:
            offset = self._write(state.snapshot())
        except Exception as exc:  # noqa: BLE001 - a snapshot is an optimisation
            logger.warning("%s: could not write a queue state snapshot: %s", self.name, exc)
            state.since_snapshot = 0
            return
        self._state_log.delete_records_before(offset)
        for p, part in enumerate(state.partitions):
            log = self._logs[p]
            if part.floor > log.log_start_offset:
                log.delete_records_before(min(part.floor, log.high_watermark))

    # ------------------------------------------------------------------ consuming
    def get(self, timeout: float | None = None) -> Message | None:
        """Lease the next message and return it, waiting up to ``timeout`` seconds (None:
        forever); None on timeout. Redeliveries (expired or nacked) come before new messages."""
        msg, _ = self._try_get()
        if msg is not None:
            return msg
        return self.store.wait_until_done(self._attempts(timeout, time.monotonic, 1.0))

    async def aget(self, timeout: float | None = None) -> Message | None:
        """:meth:`get` for asyncio: the lease is taken on the event loop (a short critical
        section), waiting happens in the default executor. Cancelling it loses nothing."""
        msg, _ = self._try_get()
        if msg is not None:
            return msg
        import asyncio  # loaded by whoever runs this coroutine; not by importing the queue

        loop = asyncio.get_running_loop()
        return await self.store.await_until_done(self._attempts(timeout, loop.time, 0.5))

    def _attempts(self, timeout: float | None, clock: Any, longest: float) -> Generator[tuple[int, float], None, Message | None]:
        """The get loop without its way of waiting: tries to lease, and when nothing is ready
        yields (notification counter, seconds to wait) — until the next lease expiry or
        redelivery at most, and ``longest`` — then tries again; returns the message or None."""
        deadline = None if timeout is None else clock() + timeout
        while True:
            seen = self.store.notification()
            msg, next_time = self._try_get()
            if msg is not None:
                return msg
            wait = None if deadline is None else deadline - clock()
            if wait is not None and wait <= 0:
                return None
            if next_time is not None:
                until_due = max(0.001, (next_time - _now_ms()) / 1000.0)
                wait = until_due if wait is None else min(wait, until_due)
            yield seen, longest if wait is None else min(wait, longest)

    def get_many(self, max_messages: int, timeout: float | None = None) -> list[Message]:
        """Lease up to ``max_messages`` messages at once (one pass through the state log's lock
        instead of one per message); waits like :meth:`get` for the first one. [] on timeout."""
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise ValueError(f"max_messages must be a positive int, got {max_messages!r}")
        first = self.get(timeout)
        if first is None:
            return []
        out = [first]
        with self._exclusive:
            self._catch_up()
            while len(out) < max_messages:
                msg, _ = self._choose(_now_ms())
                if msg is None:
                    break
                out.append(msg)
        return out

    def _try_get(self) -> tuple[Message | None, int | None]:
        if self._closed:
            raise LogClosedError(f"queue {self.name} is closed")
        with self._exclusive:
            self._catch_up()
            return self._choose(_now_ms())

    def _choose(self, now: int) -> tuple[Message | None, int | None]:
        """Lease the next message (redeliveries first); inside the lock, caught up."""
        state = self._state
        while True:
            due = state.next_due(now)
            if due is None:
                break
            p, off, count = due
            if self.max_deliveries is not None and count >= self.max_deliveries:
                self._dead_letter(p, off, count)
                continue
            msg = self._lease(p, off, count + 1, now)
            if msg is not None:
                return msg, None
        for i in range(self.partitions):
            p = (self._next_partition + i) % self.partitions
            part = state.partitions[p]
            while part.cursor < self._logs[p].high_watermark:
                off = part.cursor
                if (p, off) in state.inflight or off in part.done or off < part.floor:
                    part.cursor += 1  # (only after a snapshot from an older layout)
                    continue
                self._next_partition = p + 1
                msg = self._lease(p, off, 1, now)
                if msg is not None:
                    return msg, None
        self._maybe_snapshot()
        return None, state.next_time()

    def _lease(self, p: int, off: int, count: int, now: int) -> Message | None:
        record = self._record(p, off)
        if record is None:
            # Deleted by retention underneath the queue: count it as done.
            logger.warning("queue %s: message %d-%d was deleted before it was acknowledged", self.name, p, off)
            self._write_done(b"D", p, off)
            return None
        lease = self._write_lease(p, off, count, now + self.visibility_ms)
        if self._state.since_snapshot >= _SNAPSHOT_EVERY:
            self._maybe_snapshot()
        return Message(record.value, record.key, record.headers, record.timestamp, p, off, count, lease, self)

    def _record(self, p: int, off: int) -> Record | None:
        if self._recent:
            with self._recent_lock:
                mine = self._recent.pop((p, off), None)
            if mine is not None:
                return mine
        cached = self._cache.get(p)
        if cached and cached[0].offset <= off <= cached[-1].offset:
            i = off - cached[0].offset
            if i < len(cached) and cached[i].offset == off:
                return cached[i]
        log = self._logs[p]
        try:
            records = log.read(off, max_bytes=64 << 10, max_records=256)
        except OffsetOutOfRangeError:
            return None
        self._cache[p] = records
        for r in records:
            if r.offset == off:
                return r
        return None

    def _dead_letter(self, p: int, off: int, count: int) -> None:
        record = self._record(p, off)
        if record is not None:
            headers = list(record.headers) + [
                ("logstore.queue", self.name.encode()), ("logstore.partition", str(p).encode()),
                ("logstore.offset", str(off).encode()), ("logstore.deliveries", str(count).encode())]
            dlq = self.store.partition(self.dead_letter_topic, 0)
            dlq.append(record.value, record.key, headers)
            dlq.flush()
        self._write_done(b"D", p, off)
        logger.warning("queue %s: message %d-%d moved to %s after %d deliveries", self.name, p, off,
                       self.dead_letter_topic, count)

    def ack_many(self, msgs: Iterable[Message]) -> int:
        """Acknowledge several messages with one pass through the state log's lock; returns how
        many were not done already."""
        done = 0
        with self._exclusive:
            self._catch_up()
            for msg in msgs:
                part = self._state.partitions[msg.partition]
                if msg.offset < part.floor or msg.offset in part.done:
                    continue
                self._write_done(b"A", msg.partition, msg.offset)
                done += 1
        if self.fsync_acks and done:
            self._state_log.flush()
        return done

    def ack(self, msg: Message) -> bool:
        """Mark the message done: it is never delivered again. Returns False if it was done
        already (acked twice, or acked after another delivery of it was acked)."""
        p, off = msg.partition, msg.offset
        with self._exclusive:
            self._catch_up()
            part = self._state.partitions[p]
            if off < part.floor or off in part.done:
                return False
            self._write_done(b"A", p, off)
        if self.fsync_acks:
            self._state_log.flush()
        return True

    def nack(self, msg: Message, delay: float = 0.0) -> bool:
        """Give the message back: it is delivered again after ``delay`` seconds. Returns False
        when this delivery is no longer current (its visibility timeout expired and it was
        delivered again, or it was acked)."""
        with self._exclusive:
            self._catch_up()
            current = self._state.inflight.get((msg.partition, msg.offset))
            if current is None or current[2] != msg.lease:
                return False
            self._write(_NACK.pack(b"N", msg.partition, msg.offset, current[1], _now_ms() + int(delay * 1000)))
        if self.fsync_acks:
            self._state_log.flush()
        return True

    def qsize(self) -> int:
        """Messages put and neither acknowledged nor dead-lettered (delivered ones included)."""
        with self._exclusive:
            self._catch_up()
            total = 0
            for p, part in enumerate(self._state.partitions):
                total += max(0, self._logs[p].log_end_offset - part.floor - len(part.done))
            return total

    def in_flight(self) -> int:
        """Messages delivered and not yet acknowledged, nacked or expired."""
        with self._exclusive:
            self._catch_up()
            return len(self._state.inflight)

    def close(self) -> None:
        """Close the queue (and its store, when the queue opened it). Unacknowledged deliveries
        are redelivered after their visibility timeout. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> "Queue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Queue({self.store.root!r}, {self.name!r})"



class _AsyncFlusher:
    """Group commit for coroutines of one event loop. A coroutine that appended waits for the
    next fsync that starts after its append; the fsync runs in the default executor while the
    loop goes on, and when it ends, one fsync covers every coroutine that appended meanwhile.
    (Starting the fsync at once, rather than from a task queued behind the coroutines already
    woken, keeps the disk and the loop busy at the same time instead of taking turns.)"""

    def __init__(self, log: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._log = log
        self._loop = loop
        self._waiters: list[asyncio.Future[None]] = []
        self._running = False

    def wait(self) -> "asyncio.Future[None]":
        """A future resolved by the end of an fsync that started after this call."""
        future = self._loop.create_future()
        self._waiters.append(future)
        if not self._running:
            self._start()
        return future

    def _start(self) -> None:
        batch, self._waiters = self._waiters, []
        self._running = True
        done = self._loop.run_in_executor(None, self._log.flush)
        done.add_done_callback(lambda fsync: self._finished(batch, fsync))

    def _finished(self, batch: list["asyncio.Future[None]"], fsync: "asyncio.Future[None]") -> None:
        self._running = False
        exc = None if fsync.cancelled() else fsync.exception()
        for future in batch:
            if future.done():
                continue  # the waiting coroutine was cancelled
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(None)
        if self._waiters:
            self._start()
