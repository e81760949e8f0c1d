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

Transactions (Kafka's KIP-98, without a network hop): ``store.producer(transactional_id="x")``
gets a producer id and epoch for ``x`` from the store's transaction coordinator
(:func:`~logstore.txn.local.store_coordinator`; a producer made before with the same id, in any
process of the store, is fenced and its open transaction aborted). Between
:meth:`Producer.begin_transaction` and :meth:`~Producer.commit_transaction` or
:meth:`~Producer.abort_transaction`, its batches are written as a client's transactional batches
(producer id, epoch, sequences; each partition added to the transaction first) and
:meth:`~Producer.send_offsets_to_transaction` commits a consumer group's offsets with them: a
read_committed reader sees all of it at the commit, none of it after an abort. So a
consume-transform-produce loop inside one store is exactly once.

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
from ..errors import (InvalidConfigError, InvalidProducerEpochError, InvalidTxnStateError, LogClosedError, LogstoreError,
                      ProducerFencedError, RecordTooLargeError, UnknownTopicOrPartitionError)

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
        transactional_id: makes a transactional producer (see the module docs): records may be
            sent only inside a transaction. Construction fences every earlier producer of the id.
        transaction_timeout_ms: a transaction open longer is aborted by the coordinator
            (Kafka's ``transaction.timeout.ms``).

    Thread-safe. Close it (or use it as a context manager) to write what is pending; closing a
    transactional producer inside a transaction aborts it.
    """

    def __init__(self, store: Any, *, compression: str | None = None, linger_ms: float = 5,
                 batch_size: int = 16384, partitioner: str | Callable[[bytes | None, int, str], int] = "default",
                 durability: str = "written", transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60_000) -> None:
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
        self._txn: _Transactions | None = None
        if transactional_id is not None:
            self._txn = _Transactions(store, transactional_id, transaction_timeout_ms)
        self._sender = threading.Thread(target=self._run_sender, name="logstore-producer", daemon=True)
        self._sender.start()

    # ------------------------------------------------------------------ partitioning
    def _round_robin(self, key: bytes | None, partitions: int, topic: str) -> int:
        n = self._counters.get(topic, 0)
        self._counters[topic] = n + 1
        return n % partitions

    def _partitions(self, topic: str, partition: int | None = None) -> int:
        """The topic's partition count as the store knows it now (it looks at the topic's file
        again after a while, so partitions added by CreatePartitions, here or by another
        process, are picked up as by a Kafka producer's metadata refresh); a ``partition`` past
        it makes the store look at once."""
        n = self._store.partitions_for(topic)
        if partition is not None and partition.__class__ is int and partition >= n:
            try:
                self._store.partition(topic, partition)
                n = self._store.partitions_for(topic)
            except UnknownTopicOrPartitionError:
                pass
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
            InvalidTxnStateError: a transactional producer outside a transaction.
        """
        if self._txn is not None:
            self._txn.check_open()
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
            partitions = self._partitions(topic, partition)
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
            if self._txn is not None:
                batch.base_offset = self._txn.write(log, batch, self._codec)
            else:
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

    # ------------------------------------------------------------------ transactions
    def _transactions(self) -> "_Transactions":
        if self._txn is None:
            raise InvalidTxnStateError("not a transactional producer (give store.producer a transactional_id)")
        return self._txn

    def begin_transaction(self) -> None:
        """Start a transaction: what is sent until :meth:`commit_transaction` or
        :meth:`abort_transaction` becomes visible to read_committed readers all at once, or never.

        Raises:
            InvalidTxnStateError: not a transactional producer, or a transaction is open.
        """
        self._transactions().begin()

    def send_offsets_to_transaction(self, offsets: Any, group: str | None = None, timeout: float = 30.0) -> None:
        """Commit a consumer group's offsets as part of the transaction (Kafka's
        sendOffsetsToTransaction): ``offsets`` is a :class:`~logstore.Consumer` (its positions in
        its assigned partitions, in its group) or ``{(topic, partition): offset}`` with ``group``.
        They become the group's committed offsets at the commit, never after an abort.

        Raises:
            InvalidTxnStateError: no transaction is open.
            ProducerFencedError: a newer producer took the transactional id over.
        """
        txn = self._transactions()
        if group is None:
            group = getattr(offsets, "group", None)
            if not isinstance(group, str):
                raise ValueError("send_offsets_to_transaction needs a Consumer, or offsets and a group")
            offsets = {tp: offsets.position(*tp) for tp in offsets.assignment()}
        txn.send_offsets(dict(offsets), group, timeout)

    def commit_transaction(self, timeout: float = 30.0) -> None:
        """Write everything sent in the transaction, then commit it; returns once the commit is
        complete in every partition (read_committed readers see it).

        Raises:
            InvalidTxnStateError: no transaction is open.
            ProducerFencedError: a newer producer took the transactional id over (the
                transaction was aborted).
            LogstoreError: a send of the transaction failed (it must be aborted), or the
                coordinator refused.
            TimeoutError: not done within ``timeout`` seconds.
        """
        txn = self._transactions()
        txn.start_ending()
        self.flush(timeout)
        txn.end(True, timeout)

    def abort_transaction(self, timeout: float = 30.0) -> None:
        """Abort the transaction: what it wrote is never seen by read_committed readers, and
        its offsets are not committed.

        Raises:
            InvalidTxnStateError: no transaction is open.
            ProducerFencedError: a newer producer took the transactional id over.
            TimeoutError: not done within ``timeout`` seconds.
        """
        txn = self._transactions()
        txn.start_ending()
        self.flush(timeout)
        txn.end(False, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Write what is queued, then stop the sender thread (a transactional producer inside a
        transaction aborts it first). Idempotent."""
        with self._lock:
            if self._closed:
                return
        if self._txn is not None and self._txn.open:
            try:
                self.abort_transaction(30.0 if timeout is None else timeout)
            except LogstoreError as exc:  # fenced or refused: the coordinator's timeout aborts it
                logger.warning("closing %s inside a transaction: its abort failed: %s", self._txn.transactional_id, exc)
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


class _Transactions:
    """A transactional producer's side of the protocol: its producer id and epoch, the
    transaction's state and partitions, each partition's next sequence. Thread-safe (one lock;
    a partition's writes are serialised by the producer's write lock of that partition)."""

    _RETRY_S = 0.002

    def __init__(self, store: Any, transactional_id: str, timeout_ms: int) -> None:
        from ..errorcodes import ErrorCode
        from ..txn.local import store_coordinator

        if not isinstance(transactional_id, str) or not transactional_id:
            raise InvalidConfigError(f"transactional_id must be a non-empty str, got {transactional_id!r}")
        self._codes = ErrorCode
        self.store = store
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.coordinator = store_coordinator(store)
        self._lock = threading.Lock()
        self.open = False
        self.ending = False
        self._partitions: set[tuple[str, int]] = set()
        self._sequences: dict[tuple[str, int], int] = {}
        self._failed: BaseException | None = None
        self._touched = False  # a partition or the offsets were added: EndTxn is needed
        deadline = time.monotonic() + 60.0
        while True:
            error, pid, epoch = self.coordinator.init_producer_id(transactional_id, timeout_ms)
            if error != ErrorCode.concurrent_transactions or time.monotonic() > deadline:
                break
            time.sleep(self._RETRY_S)  # an earlier producer's transaction is being aborted
        self._raise(error, "initialising the transactional id")
        self.producer_id, self.epoch = pid, epoch

    def _raise(self, error: int, what: str) -> None:
        codes = self._codes
        if error == codes.none:
            return
        if error in (codes.producer_fenced, codes.invalid_producer_epoch, codes.invalid_producer_id_mapping):
            raise ProducerFencedError(f"{self.transactional_id}: {what}: a newer producer took the transactional id "
                                      f"over ({codes(error).name})")
        if error == codes.invalid_txn_state:
            raise InvalidTxnStateError(f"{self.transactional_id}: {what}: {codes(error).name}")
        raise LogstoreError(f"{self.transactional_id}: {what}: the transaction coordinator answered "
                            f"{codes(error).name}")

    def _retrying(self, call: Callable[[], int], what: str, timeout: float) -> None:
        """Call until the answer is not CONCURRENT_TRANSACTIONS (a transaction completing)."""
        deadline = time.monotonic() + timeout
        while True:
            error = call()
            if error != self._codes.concurrent_transactions:
                self._raise(error, what)
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.transactional_id}: {what}: still busy after {timeout} s")
            time.sleep(self._RETRY_S)

    def check_open(self) -> None:
        if not self.open:
            raise InvalidTxnStateError(f"{self.transactional_id}: no transaction is open (begin_transaction first)")
        if self.ending:
            raise InvalidTxnStateError(f"{self.transactional_id}: the transaction is being committed or aborted")

    def start_ending(self) -> None:
        """Commit or abort begins (or is tried again after it failed): no more sends in this
        transaction."""
        with self._lock:
            if not self.open:
                raise InvalidTxnStateError(f"{self.transactional_id}: no transaction is open (begin_transaction first)")
            self.ending = True

    def begin(self) -> None:
        with self._lock:
            if self.open:
                raise InvalidTxnStateError(f"{self.transactional_id}: a transaction is open already")
            self.open = True
            self.ending = False
            self._partitions.clear()
            self._failed = None
            self._touched = False

    def write(self, log: Any, batch: _Batch, codec: str | None) -> int:
        """Append a batch of the transaction to ``log`` (adding its partition to the
        transaction first) as a client's transactional batch; return its first offset."""
        from ..records.batch import BatchBuilder
        from ..records.batching import codec_for, encode_batches

        tp = (batch.topic, batch.partition)
        try:
            if tp not in self._partitions:
                self._retrying(lambda: self.coordinator.add_partitions(
                    self.transactional_id, self.producer_id, self.epoch, [tp])[tp], f"adding {tp[0]}-{tp[1]}", 30.0)
                with self._lock:
                    self._partitions.add(tp)
                    self._touched = True
            sequence = self._sequences.get(tp, 0)
            kind = codec_for(codec)
            pieces = encode_batches(BatchBuilder(), batch.values, batch.keys, batch.headers, batch.timestamps,
                                    limit=log.config.max_message_bytes, codec=kind, level=log.config.level_for(kind),
                                    timestamp_type=0, log_append_time=None, producer_id=self.producer_id,
                                    base_sequence=sequence, producer_epoch=self.epoch, transactional=True)
            first = -1
            for piece, _ in pieces:
                info = log.append_idempotent(bytes(piece))
                first = info.first_offset if first < 0 else first
            self._sequences[tp] = (sequence + len(batch.values)) % (1 << 31)
            return first
        except InvalidProducerEpochError as exc:
            fenced = ProducerFencedError(f"{self.transactional_id}: a newer producer took the transactional id "
                                         f"over: {exc}")
            self._failed = fenced
            raise fenced from exc
        except BaseException as exc:
            self._failed = exc
            raise

    def send_offsets(self, offsets: dict[tuple[str, int], int], group: str, timeout: float) -> None:
        from ..groups.offsets import offset_store

        self.check_open()
        self._retrying(lambda: self.coordinator.add_offsets(self.transactional_id, self.producer_id, self.epoch, group,
                                                            lambda _: 0), f"adding the offsets of {group!r}", timeout)
        self._touched = True
        offset_store(self.store).commit_transactional(group, offsets, self.producer_id, self.epoch)

    def end(self, commit: bool, timeout: float) -> None:
        """EndTxn, then wait until the transaction is complete in every partition."""
        what = "committing" if commit else "aborting"
        if commit and isinstance(self._failed, ProducerFencedError):
            raise self._failed
        if commit and self._failed is not None:
            raise LogstoreError(f"{self.transactional_id}: a send of the transaction failed ({self._failed}); "
                                "abort it") from self._failed
        if not self._touched:  # nothing reached the coordinator: nothing to end there (as Kafka's clients)
            with self._lock:
                self.open = self.ending = False
            return
        deadline = time.monotonic() + timeout
        self._retrying(lambda: self.coordinator.end_txn(self.transactional_id, self.producer_id, self.epoch,
                                                        commit).result(), what, timeout)
        done = "CompleteCommit" if commit else "CompleteAbort"
        wait = self._RETRY_S / 4
        while True:
            (state,) = self.coordinator.describe([self.transactional_id])
            if state.error != self._codes.none:
                self._raise(state.error, what)
            if state.state == done:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.transactional_id}: {what} did not complete within {timeout} s")
            time.sleep(wait)
            wait = min(wait * 2, 0.05)
        with self._lock:
            self.open = self.ending = False
            self._partitions.clear()
