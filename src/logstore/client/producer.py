"""Producer: batches records per partition and writes each batch through the C encoder.

``send()`` picks a partition (Kafka's default partitioner unless told otherwise), adds the record
to that partition's open batch and returns a :class:`SendFuture`. A batch is written as one Kafka
RecordBatch when it reaches ``batch_size`` bytes (by the thread whose send filled it) or when it
is ``linger_ms`` old (by the producer's sender thread), or on :meth:`Producer.flush`.

Partitioning, as Kafka's clients do it, so that keys land where a Kafka producer would put them:
a keyed record goes to ``(murmur2(key) & 0x7fffffff) % partitions``; records without a key stick
to one partition until its batch is written, then move to another (KIP-480's sticky partitioner).

Durability per send (or for the whole producer): ``"written"`` resolves the future once the batch
is in the OS page cache (it survives the death of the process); ``"fsynced"`` once it is fsynced
(it survives power loss). fsyncs of concurrent batches of one partition are shared (group commit).

Thread-safety: a Producer may be shared by any number of threads.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from typing import Any, Callable, Iterable, NamedTuple

from ..records import compression as _compression
from .._native import lib
from ..errors import InvalidConfigError, LogClosedError, RecordTooLargeError, UnknownTopicOrPartitionError

__all__ = ["Producer", "SendFuture", "RecordMetadata", "murmur2", "default_partition", "DURABILITY_LEVELS"]

logger = logging.getLogger("logstore.client.producer")

DURABILITY_LEVELS = ("written", "fsynced")
_RECORD_OVERHEAD = 16  # rough framing bytes per record for batch_size accounting
_time = time.time


def murmur2(key: bytes) -> int:
    """Kafka's murmur2 hash of ``key`` (a signed 32-bit int, as Java's Utils.murmur2)."""
    return int(lib.ls_murmur2(key, len(key)))


def default_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a keyed record."""
    return (lib.ls_murmur2(key, len(key)) & 0x7FFFFFFF) % partitions


class RecordMetadata(NamedTuple):
    """Where a sent record was written."""

    partition: int
    offset: int


class _Batch:
    """Records accumulated for one partition, and the outcome all their futures share."""

    __slots__ = ("topic", "partition", "values", "keys", "headers", "timestamps", "size", "created",
                 "fsync", "base_offset", "error", "done", "callbacks", "limit")

    def __init__(self, topic: str, partition: int, limit: int) -> None:
        self.topic = topic
        self.partition = partition
        self.limit = limit
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] | None = None  # created with the first key
        self.headers: list[Any] | None = None
        self.timestamps: list[int] | None = None
        self.size = 0
        self.created = time.monotonic()
        self.fsync = False
        self.base_offset = -1
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.callbacks: list[Callable[[], None]] | None = None


class SendFuture:
    """The outcome of one :meth:`Producer.send`: a :class:`RecordMetadata` or an exception.

    Mirrors ``concurrent.futures.Future``: :meth:`result`, :meth:`exception`, :meth:`done`,
    :meth:`add_done_callback` (``get`` is an alias of ``result``, as in kafka-python).
    Thread-safe.
    """

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: _Batch, index: int) -> None:
        self._batch = batch
        self._index = index

    def done(self) -> bool:
        """True once the record's batch was written or failed."""
        return self._batch.done.is_set()

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """Wait for the write; return (partition, offset) or raise what the write raised.

        Raises:
            TimeoutError: not resolved within ``timeout`` seconds.
        """
        batch = self._batch
        if not batch.done.wait(timeout):
            raise TimeoutError(f"record not written within {timeout} s")
        if batch.error is not None:
            raise batch.error
        return RecordMetadata(batch.partition, batch.base_offset + self._index)

    get = result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The write's exception, or None when it succeeded (waits like result())."""
        batch = self._batch
        if not batch.done.wait(timeout):
            raise TimeoutError(f"record not written within {timeout} s")
        return batch.error

    def add_done_callback(self, fn: Callable[["SendFuture"], Any]) -> None:
        """Call ``fn(future)`` once resolved (at once if it is; else from the writing thread)."""
        batch = self._batch
        call = lambda: _run_callback(fn, self)  # noqa: E731
        with _CALLBACK_LOCK:
            if not batch.done.is_set():
                if batch.callbacks is None:
                    batch.callbacks = []
                batch.callbacks.append(call)
                return
        call()

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("error" if self._batch.error else "done")
        return f"SendFuture({self._batch.topic}-{self._batch.partition}, {state})"


_CALLBACK_LOCK = threading.Lock()


def _run_callback(fn: Callable[[SendFuture], Any], future: SendFuture) -> None:
    try:
        fn(future)
    except Exception:  # noqa: BLE001 - a user callback must not break the producer
        logger.exception("producer callback %r raised", fn)


class Producer:
    """Sends records to a :class:`~logstore.LogStore`'s topics in batches. Use
    ``store.producer(...)``.

    Args:
        store: the LogStore.
        compression: codec for the batches ("none", "gzip", "snappy", "lz4", "zstd"); a topic
            whose compression_type is not "producer" recompresses with its own.
        linger_ms: how long a batch may wait for more records before it is written.
        batch_size: bytes of records after which a batch is written at once (Kafka's
            batch.size; one batch may also be split by the log at max_message_bytes).
        partitioner: "default" (murmur2 for keys, sticky for null keys), "round_robin", or a
            callable ``(key, partitions, topic) -> partition``.
        durability: "written" or "fsynced" (see the module docs); per send it can be raised.

    Thread-safe. Close it (or use it as a context manager) to write what is pending.
    """

    def __init__(self, store: Any, *, compression: str | None = None, linger_ms: float = 5,
                 batch_size: int = 16384, partitioner: str | Callable[[bytes | None, int, str], int] = "default",
                 durability: str = "written") -> None:
        self._store = store
        self._codec = None if compression in (None, "none") else compression
        if self._codec is not None:
            _compression.codec_from_name(self._codec)  # raises on an unknown codec
        if isinstance(linger_ms, bool) or not isinstance(linger_ms, (int, float)) or linger_ms < 0:
            raise InvalidConfigError(f"linger_ms must be a number >= 0, got {linger_ms!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        self.linger_s = linger_ms / 1000.0
        self.batch_size = batch_size
        self.durability = _check_durability(durability)
        if partitioner == "default":
            self._partitioner: Callable[[bytes | None, int, str], int] | None = None
        elif partitioner == "round_robin":
            self._partitioner = self._round_robin
        elif callable(partitioner):
            self._partitioner = partitioner
        else:
            raise InvalidConfigError(f"partitioner must be 'default', 'round_robin' or a callable, got {partitioner!r}")
        self._lock = threading.Lock()
        self._batches: dict[tuple[str, int], _Batch] = {}
        self._sticky: dict[str, int] = {}
        self._counters: dict[str, int] = {}
        self._partition_counts: dict[str, int] = {}
        self._limits: dict[tuple[str, int], int] = {}
        self._in_flight: set[_Batch] = set()
        #: The open batch of each topic's sticky partition: send()'s fast path appends to it.
        self._sticky_batches: dict[str, _Batch] = {}
        self._default_fsync = self.durability == "fsynced"
        self._queued: dict[tuple[str, int], deque[_Batch]] = {}
        self._write_locks: dict[tuple[str, int], threading.Lock] = {}
        self._closed = False
        self._wake = threading.Condition(self._lock)
        self._sender = threading.Thread(target=self._run_sender, name="logstore-producer", daemon=True)
        self._sender.start()

    # ------------------------------------------------------------------ partitioning
    def _round_robin(self, key: bytes | None, partitions: int, topic: str) -> int:
        n = self._counters.get(topic, 0)
        self._counters[topic] = n + 1
        return n % partitions

    def _partitions(self, topic: str) -> int:
        n = self._partition_counts.get(topic)
        if n is None:
            n = self._store.partitions_for(topic)
            self._partition_counts[topic] = n
        return n

    def _sticky_partition(self, topic: str, partitions: int, avoid: int = -1) -> int:
        if partitions == 1:
            choice = 0
        else:
            choice = random.randrange(partitions - 1 if avoid >= 0 else partitions)
            if avoid >= 0 and choice >= avoid:
                choice += 1
        self._sticky[topic] = choice
        return choice

    # ------------------------------------------------------------------ sending
    def send(self, topic: str, value: bytes | None, key: bytes | None = None,
             headers: Iterable[tuple[str, bytes | None]] = (), partition: int | None = None,
             timestamp: int | None = None, durability: str | None = None) -> SendFuture:
        """Queue one record; return a future resolving to ``RecordMetadata(partition, offset)``.

        Raises (at once, nothing queued):
            TypeError: value/key not bytes or None.
            UnknownTopicOrPartitionError: no such topic or partition.
            RecordTooLargeError: the record alone exceeds the topic's max_message_bytes.
            LogClosedError: the producer is closed.
        """
        if (key is None and partition is None and timestamp is None and durability is None and not headers
                and value.__class__ is bytes):
            # Fast path (null key, sticky partition, open batch with room): one lock, one append.
            lock = self._lock
            lock.acquire()
            try:
                batch = self._sticky_batches.get(topic)
                if batch is not None:
                    size = batch.size + len(value) + _RECORD_OVERHEAD
                    if size < self.batch_size and size <= batch.limit:
                        values = batch.values
                        index = len(values)
                        values.append(value)
                        batch.size = size
                        return SendFuture(batch, index)
            finally:
                lock.release()
        return self._send(topic, value, key, headers, partition, timestamp, durability)

    def _send(self, topic: str, value: Any, key: Any, headers: Any, partition: Any, timestamp: Any,
              durability: Any) -> SendFuture:
        explicit = partition
        if value is not None and value.__class__ is not bytes:
            value = _as_bytes(value, "value")
        if key is not None and key.__class__ is not bytes:
            key = _as_bytes(key, "key")
        size = (0 if value is None else len(value)) + (0 if key is None else len(key)) + _RECORD_OVERHEAD
        if headers:
            headers = _check_headers(headers)
            size += sum(len(h[0]) + len(h[1] or b"") + 4 for h in headers)
        if timestamp is not None:
            timestamp = _check_ts(timestamp)
        fsync = durability == "fsynced" or (durability is None and self.durability == "fsynced")
        if durability is not None:
            _check_durability(durability)
        full = None
        with self._lock:
            if self._closed:
                raise LogClosedError("producer is closed")
            partitions = self._partition_counts.get(topic) or self._partitions(topic)
            if partition is None:
                if self._partitioner is not None:
                    partition = self._partitioner(key, partitions, topic)
                    if not 0 <= partition < partitions:
                        raise UnknownTopicOrPartitionError(
                            f"partitioner chose partition {partition} of topic {topic!r} with {partitions}")
                elif key is not None:
                    partition = (lib.ls_murmur2(key, len(key)) & 0x7FFFFFFF) % partitions
                else:
                    partition = self._sticky.get(topic)
                    if partition is None:
                        partition = self._sticky_partition(topic, partitions)
            elif isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < partitions:
                raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition!r}")
            tp = (topic, partition)
            limit = self._limits.get(tp)
            if limit is None:
                limit = self._limits[tp] = self._store.partition(topic, partition).config.max_message_bytes
            if size > limit:
                raise RecordTooLargeError(size, limit)
            batch = self._batches.get(tp)
            if batch is None:
                batch = self._batches[tp] = _Batch(topic, partition, limit)
                self._wake.notify()  # the sender times its linger from the oldest batch
            index = len(batch.values)
            batch.values.append(value)
            if key is not None or batch.keys is not None:
                if batch.keys is None:
                    batch.keys = [None] * index
                batch.keys.append(key)
            if headers or batch.headers is not None:
                if batch.headers is None:
                    batch.headers = [()] * index
                batch.headers.append(headers or ())
            if timestamp is not None or batch.timestamps is not None:
                if batch.timestamps is None:
                    now = int(_time() * 1000)
                    batch.timestamps = [now] * index
                batch.timestamps.append(int(_time() * 1000) if timestamp is None else timestamp)
            if fsync:
                batch.fsync = True
            batch.size += size
            # The fast path may append to this batch while it holds only plain records.
            if (key is None and self._partitioner is None and explicit is None and batch.keys is None
                    and batch.headers is None and batch.timestamps is None
                    and (batch.fsync or not self._default_fsync)):
                self._sticky_batches[topic] = batch
            elif self._sticky_batches.get(topic) is batch:
                del self._sticky_batches[topic]
            if batch.size >= self.batch_size:
                full = self._batches.pop(tp)
                if self._sticky_batches.get(topic) is full:
                    del self._sticky_batches[topic]
                self._in_flight.add(full)
                self._queued.setdefault(tp, deque()).append(full)
                if key is None and self._partitioner is None and self._sticky.get(topic) == partition:
                    self._sticky_partition(topic, partitions, avoid=partition)
        if full is not None:
            self._drain(tp)
        return SendFuture(batch, index)

    def _drain(self, tp: tuple[str, int]) -> None:
        """Write the partition's taken batches in the order they were taken: one writer per
        partition at a time, so that a thread's records keep their order in the log."""
        with self._write_locks.setdefault(tp, threading.Lock()):
            while True:
                with self._lock:
                    queued = self._queued.get(tp)
                    if not queued:
                        return
                    batch = queued.popleft()
                self._write(batch)

    def _write(self, batch: _Batch) -> None:
        """Append one batch and resolve its futures (called without the producer's lock)."""
        try:
            log = self._store.partition(batch.topic, batch.partition)
            batch.base_offset = log.append_batch(batch.values, batch.keys, batch.headers, batch.timestamps,
                                                 compression=self._codec)
            if batch.fsync:
                log.flush()
        except BaseException as exc:  # noqa: BLE001 - delivered through the futures
            batch.error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            with _CALLBACK_LOCK:
                batch.done.set()
                callbacks, batch.callbacks = batch.callbacks, None
            with self._lock:
                self._in_flight.discard(batch)
                self._wake.notify_all()
            batch.values = batch.keys = []  # type: ignore[assignment]
            batch.headers = batch.timestamps = None
            for call in callbacks or ():
                call()

    def _take_due(self, everything: bool) -> list[tuple[str, int]]:
        """Take the batches whose linger expired (or all) for writing; returns their partitions.
        Holds the lock."""
        now = time.monotonic()
        due = [tp for tp, b in self._batches.items() if everything or now - b.created >= self.linger_s]
        out = []
        for tp in due:
            batch = self._batches.pop(tp)
            if self._sticky_batches.get(tp[0]) is batch:
                del self._sticky_batches[tp[0]]
            self._in_flight.add(batch)
            self._queued.setdefault(tp, deque()).append(batch)
            out.append(tp)
            if self._sticky.get(tp[0]) == tp[1] and self._partitioner is None:
                self._sticky_partition(tp[0], self._partition_counts.get(tp[0], 1), avoid=tp[1])
        return out

    def _run_sender(self) -> None:
        while True:
            with self._lock:
                while not self._batches and not self._closed:
                    self._wake.wait()
                if self._closed and not self._batches:
                    return
                oldest = min((b.created for b in self._batches.values()), default=time.monotonic())
                delay = oldest + self.linger_s - time.monotonic()
                if delay > 0 and not self._closed:
                    self._wake.wait(delay)
                taken = self._take_due(everything=self._closed)
            for tp in taken:
                self._drain(tp)

    def flush(self, timeout: float | None = None) -> None:
        """Write every queued record now and wait until all sends so far are resolved.

        Raises:
            TimeoutError: not finished within ``timeout`` seconds.
        """
        with self._lock:
            taken = self._take_due(everything=True)
        for tp in taken:
            self._drain(tp)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._in_flight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"producer flush did not finish within {timeout} s")
                self._wake.wait(remaining)

    def close(self, timeout: float | None = None) -> None:
        """Write what is queued, then stop the sender thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
        self.flush(timeout)
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        self._sender.join(timeout)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_durability(durability: Any) -> str:
    if durability not in DURABILITY_LEVELS:
        raise InvalidConfigError(f"durability must be one of {DURABILITY_LEVELS}, got {durability!r}")
    return durability


def _check_headers(headers: Iterable[Any]) -> list[tuple[str, bytes | None]]:
    out = []
    for item in headers:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError(f"headers must be (str, bytes | None) pairs, got {item!r}")
        name, value = item
        if not isinstance(name, str):
            raise TypeError(f"header name must be str, got {type(name).__name__}")
        if value is not None and not isinstance(value, bytes):
            if isinstance(value, (bytearray, memoryview)):
                value = bytes(value)
            else:
                raise TypeError(f"header {name!r} value must be bytes or None, got {type(value).__name__}")
        out.append((name, value))
    return out


def _check_ts(timestamp: Any) -> int:
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise TypeError(f"timestamp must be an int (ms since epoch) or None, got {type(timestamp).__name__}")
    return timestamp


def _as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes or None, got {type(value).__name__}")
