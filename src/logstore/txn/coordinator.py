"""Kafka's transaction coordinator over the one partition of ``__transaction_state``.

The coordinator keeps every transactional id's :class:`~logstore.txn.metadata.TransactionMetadata`
in memory and its last state in ``__transaction_state`` (:mod:`logstore.txn.metadata`'s record),
as Kafka's TransactionCoordinator and TransactionStateManager do. Every change is made in Kafka's
two steps: the transition is prepared under the lock (its target state becomes *pending*, which
answers any other request for that id with CONCURRENT_TRANSACTIONS), its record is appended and
fsynced without the lock, and only then is it applied (or given up, when the write failed). A
client is answered after its record is durable, never before.

The rules, as Kafka's:

- InitProducerId: a new transactional id gets a producer id from the allocator and epoch 0; a
  known one its next epoch (a new producer fences the old one), or a new producer id at epoch 0
  once the epoch is exhausted (32766). KIP-360: a producer recovering from an error names the
  producer id and epoch it has; it is fenced (PRODUCER_FENCED) unless they are the current ones
  (bump), the last ones (a retry: the current epoch again) or the epoch before a rotation. An
  open transaction of the old producer is aborted first: its epoch is bumped (PrepareEpochFence,
  never written), PrepareAbort written, and CONCURRENT_TRANSACTIONS answered; the client retries
  and gets one epoch more once the abort completed. A timeout above ``transaction.max.timeout.ms``
  is INVALID_TRANSACTION_TIMEOUT.
- AddPartitionsToTxn / AddOffsetsToTxn: the partitions join the transaction (Ongoing; it starts
  now if it was not open). An unknown id or another producer id is INVALID_PRODUCER_ID_MAPPING,
  another epoch PRODUCER_FENCED, a transaction completing CONCURRENT_TRANSACTIONS; partitions
  already in it are answered at once without a write.
- EndTxn: PrepareCommit or PrepareAbort is written and the client answered; the markers are then
  written to every partition of the transaction (``write_markers``, asynchronously, retried
  while a partition fails with a retriable error), and then CompleteCommit or CompleteAbort. A
  retry of a completed EndTxn of the same outcome is answered NONE, of the other outcome
  INVALID_TXN_STATE; while it completes, CONCURRENT_TRANSACTIONS; EndTxn without a transaction
  INVALID_TXN_STATE.
- Timeouts: :meth:`TransactionCoordinator.abort_expired` fences and aborts every transaction open
  longer than its timeout, so its producer's next request is PRODUCER_FENCED (and its batches
  INVALID_PRODUCER_EPOCH at the partitions, once the abort markers carry the new epoch).
- Expiration: :meth:`TransactionCoordinator.expire_ids` writes a tombstone for every id idle
  (Empty, CompleteCommit, CompleteAbort) for ``transactional.id.expiration.ms``.
- Loading: :meth:`TransactionCoordinator.load` replays the topic (the last record of each id wins,
  tombstones delete) and finishes every transaction it finds in PrepareCommit or PrepareAbort:
  its markers are written again and its Complete record follows, so a restart in the middle of a
  commit completes the commit. Requests before the load ends are COORDINATOR_LOAD_IN_PROGRESS.

Not copied from Kafka, and why:

- KIP-890's transaction version 2 (an epoch bump at every EndTxn, EndTxn v5 answering the new
  producer id and epoch): :meth:`~TransactionCoordinator.end_txn` answers an error only, so the
  coordinator speaks transaction versions 0 and 1; the metadata's transitions know version 2.
- The limit ``max_ongoing`` on open transactions is logstore's own: a transaction that would
  open past it is answered CONCURRENT_TRANSACTIONS, which Kafka's producers retry after their
  backoff (COORDINATOR_NOT_AVAILABLE would send them looking for another coordinator).
- A marker write answered UNKNOWN_TOPIC_OR_PARTITION drops the partition from the markers still to
  write (Kafka does so for a partition without a leader: deleted), rather than retrying it
  forever; an unexpected error is retried with backoff and logged (Kafka treats it as fatal).
- A record that cannot be read makes :meth:`~TransactionCoordinator.load` raise (Kafka logs it
  and serves what it loaded so far, which can resurrect an older state of an id).

Processes: several processes may share a store, each with its coordinator over the same
state log, given a ``shared_lock`` (the store's flock). Every operation then runs in a section:
the process's section lock and the flock, held while it reads the state, writes its record and
applies it; on entry the records the other processes wrote since are taken up (an id's last
record replaces what this process knew of it). So the processes see one state in one order, as
if one coordinator served them all; a producer in one process fences one in another. A
transaction another process prepared is completed by this one if it stays prepared past
``TxnConfig.takeover_ms`` (its writer may have died after its Prepare record): its markers are
written in the section, while the state is still that Prepare, so a partition that has them
already takes them as no-ops, and no later transaction of the producer can have begun.

Durability: every answer that changes state comes after its record is written, and fsynced
with ``TxnConfig.fsync`` (``Log.flush``; concurrent writers share an fsync). The markers and
Complete records are written by the coordinator's thread ``logstore-txn-markers``; a crash
before a Complete record is durable is repaired by the next load.

Thread-safety: every method may be called from any thread. One lock guards the state; it is
never held while the state log is written, the allocator or ``write_markers`` is called, or a
future is completed. With ``shared_lock``, the section lock and the flock come before it (and
are held across those calls).
"""

from __future__ import annotations

import builtins
import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Iterator, NamedTuple, Sequence, TypeVar

from ..errorcodes import ErrorCode, code_for
from ..errors import (LogClosedError, LogOfflineError, LogstoreError, NotLeaderOrFollowerError, OffsetOutOfRangeError,
                      ProducerFencedError, RequestTimedOutError)
from ..groups.offsets import OFFSETS_TOPIC
from .metadata import (
    ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS,
    REMOVE_EXPIRED_TRANSACTIONAL_ID_CLEANUP_INTERVAL_MS,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TRANSACTION_MAX_TIMEOUT_MS,
    TRANSACTION_STATE_TOPIC,
    TRANSACTIONAL_ID_EXPIRATION_MS,
    TXN_VALUE_VERSIONS,
    TransactionMetadata,
    TransactionState,
    TxnLogEntry,
    TxnRecordError,
    decode_txn_key,
    decode_txn_value,
    encode_txn_key,
    encode_txn_value,
    is_epoch_exhausted,
)

if TYPE_CHECKING:
    from ..log.log import Log

__all__ = ["TransactionCoordinator", "TxnConfig", "TxnDescription", "TxnListing", "ListedTxn",
           "TxnCoordinatorError", "TopicPartition", "WriteMarkers"]

logger = logging.getLogger("logstore.txn.coordinator")

#: (topic, partition)
TopicPartition = tuple[str, int]
#: ``write_markers(producer_id, producer_epoch, commit, coordinator_epoch, partitions)``: append a
#: COMMIT (``commit``) or ABORT control batch of the producer to each partition; its future's
#: result is each partition's Kafka error code (0: written).
WriteMarkers = Callable[[int, int, bool, int, list[TopicPartition]], "Future[dict[TopicPartition, int]]"]

_S = TransactionState
#: states (current or pending) of an open transaction, which ``max_ongoing`` counts
_OPEN = frozenset({_S.ONGOING, _S.PREPARE_COMMIT, _S.PREPARE_ABORT, _S.PREPARE_EPOCH_FENCE})
_PREPARED = frozenset({_S.PREPARE_COMMIT, _S.PREPARE_ABORT})

#: marker write errors after which the partition is tried again (Kafka's retriable ones)
_MARKER_RETRIABLE = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.not_enough_replicas,
                               ErrorCode.not_enough_replicas_after_append, ErrorCode.request_timed_out,
                               ErrorCode.kafka_storage_error})
#: marker write errors after which the partition needs no marker: its topic is gone, or it never
#: held the producer's batches (Kafka's UNSUPPORTED_FOR_MESSAGE_FORMAT and UNSUPPORTED_VERSION)
_MARKER_DROPPED = frozenset({ErrorCode.unknown_topic_or_partition, ErrorCode.unsupported_for_message_format,
                             ErrorCode.unsupported_version})
#: marker write errors that say a newer producer epoch or coordinator exists: stop writing
_MARKER_FENCED = frozenset({ErrorCode.invalid_producer_epoch, ErrorCode.transaction_coordinator_fenced})

_NEW, _LOADING, _ACTIVE, _CLOSED = "new", "loading", "active", "closed"


class TxnCoordinatorError(LogstoreError):
    """The coordinator's life cycle was misused: :meth:`TransactionCoordinator.load` called
    twice or after :meth:`~TransactionCoordinator.close`. Immutable; safe to share."""


@dataclass(frozen=True)
class TxnConfig:
    """The coordinator's settings, as Kafka's broker settings of the same names. Immutable; safe to share.

    Attributes:
        transaction_max_timeout_ms: ``transaction.max.timeout.ms``: the largest timeout a
            producer may ask for.
        transactional_id_expiration_ms: ``transactional.id.expiration.ms``: an idle id expires
            after this long (see :meth:`TransactionCoordinator.expire_ids`).
        max_ongoing: at most this many transactions open at once (None: no limit; logstore's own).
        value_version: the TransactionLogValue version written: 1 (flexible, with the previous
            producer id; Kafka reads it from 3.5 on, KIP-915) or 0 (what Kafka writes with
            ``transaction.version`` 0, which every Kafka reads).
        retry_backoff_ms, retry_backoff_max_ms: a failed marker or Complete record is retried
            after ``retry_backoff_ms``, doubling per attempt up to ``retry_backoff_max_ms``.
        abort_timed_out_interval_ms: how often the marker thread aborts the transactions past
            their timeout (``transaction.abort.timed.out.transaction.cleanup.interval.ms``).
        fsync: fsync each state record before acting on it (what survives power loss: the
            points of the two-phase commit, an added partition and a Prepare record, are
            durable before the client or the markers rely on them; the caller's marker writer
            fsyncs its markers too). Without it the records are durable against a crash of the
            process (in the page cache), as an acknowledged produce is by default; Kafka's
            coordinator relies on replication, not fsync. Over a replica set's state log
            (:class:`~logstore.replica.replicatedlog.ReplicatedLog`) the log's ``flush`` waits
            for the majority instead: there, fsync means held by a majority, as acks=all.
        takeover_ms: with several processes on one store, a transaction another process
            prepared and left prepared this long is completed by this one (its writer may
            have died between its Prepare record and its markers).
        expired_ids_interval_ms: how often it removes the expired transactional ids
            (``transaction.remove.expired.transaction.cleanup.interval.ms``).
    """

    transaction_max_timeout_ms: int = TRANSACTION_MAX_TIMEOUT_MS
    transactional_id_expiration_ms: int = TRANSACTIONAL_ID_EXPIRATION_MS
    max_ongoing: int | None = None
    value_version: int = 1
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 10_000
    abort_timed_out_interval_ms: int = ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS
    expired_ids_interval_ms: int = REMOVE_EXPIRED_TRANSACTIONAL_ID_CLEANUP_INTERVAL_MS
    fsync: bool = False
    takeover_ms: int = 5_000

    def __post_init__(self) -> None:
        for name in ("transaction_max_timeout_ms", "transactional_id_expiration_ms", "retry_backoff_ms",
                     "retry_backoff_max_ms", "abort_timed_out_interval_ms", "expired_ids_interval_ms", "takeover_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.max_ongoing is not None and (isinstance(self.max_ongoing, bool) or not isinstance(
                self.max_ongoing, int) or self.max_ongoing < 1):
            raise ValueError(f"max_ongoing must be None or an int >= 1, got {self.max_ongoing!r}")
        if self.value_version not in TXN_VALUE_VERSIONS:
            raise ValueError(f"value_version must be one of {TXN_VALUE_VERSIONS}, got {self.value_version!r}")


class TxnDescription(NamedTuple):
    """One transactional id as DescribeTransactions answers it (``state`` is Kafka's name;
    ``topics`` the partitions of its open transaction by topic). Immutable; safe to share."""

    transactional_id: str
    error: int
    state: str = ""
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    txn_timeout_ms: int = 0
    txn_start_timestamp: int = -1
    topics: tuple[tuple[str, tuple[int, ...]], ...] = ()


class ListedTxn(NamedTuple):
    """One transaction of ListTransactions' answer (``state`` is Kafka's name). Immutable; safe to share."""

    transactional_id: str
    producer_id: int
    state: str


class TxnListing(NamedTuple):
    """ListTransactions' answer: the error, the state filters Kafka does not know, and the
    transactions that pass the filters. Immutable; safe to share."""

    error: int
    unknown_state_filters: tuple[str, ...] = ()
    transactions: tuple[ListedTxn, ...] = ()


@dataclass(eq=False)
class _MarkerJob:
    """A transaction being completed: its markers still to write, then its Complete record.
    Owned by the coordinator; read and changed under its lock."""

    transactional_id: str
    metadata: TransactionMetadata
    commit: bool
    producer_id: int
    producer_epoch: int
    complete: TxnLogEntry
    remaining: set[TopicPartition] = field(default_factory=set)
    attempt: int = 0


@dataclass(eq=False)
class _Task:
    """Work for the marker thread: ``send`` the job's markers, take a marker write's ``result``,
    or write the job's ``complete`` record; or, without a job, the periodic ``abort_expired``
    or ``expire_ids``."""

    kind: str
    job: _MarkerJob | None = None
    future: "Future[dict[TopicPartition, int]] | None" = None


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _partition(tp: object) -> TopicPartition:
    if (not isinstance(tp, tuple) or len(tp) != 2 or not isinstance(tp[0], str) or not tp[0]
            or isinstance(tp[1], bool) or not isinstance(tp[1], int) or tp[1] < 0):
        raise ValueError(f"a partition is a (topic, partition >= 0) pair, got {tp!r}")
    return tp[0], tp[1]


_F = TypeVar("_F", bound=Callable[..., Any])


def _in_section(method: _F) -> _F:
    """Run the method in the coordinator's section (see the module docstring, "Processes")."""
    def wrapped(self: "TransactionCoordinator", *args: Any, **kwargs: Any) -> Any:
        with self._section():
            return method(self, *args, **kwargs)
    wrapped.__name__, wrapped.__doc__, wrapped.__qualname__ = method.__name__, method.__doc__, method.__qualname__
    return wrapped  # type: ignore[return-value]


class TransactionCoordinator:
    """The transaction coordinator of one server (see the module docstring for its rules).

    Owns no file: its state is the records of ``state_log``, the one partition of
    ``__transaction_state`` (opened by the caller, compacted:
    :data:`~logstore.txn.metadata.TRANSACTION_STATE_TOPIC_CONFIG`; the caller closes it after
    :meth:`close`). Owns the thread ``logstore-txn-markers`` (started by :meth:`load`) that writes
    markers and Complete records.

    Args:
        state_log: the ``__transaction_state`` partition (:class:`logstore.log.log.Log`).
        new_producer_id: allocates a producer id never handed out before (may do I/O; called
            without the coordinator's lock).
        write_markers: see :data:`WriteMarkers`; must not block (it returns a future).
        clock: milliseconds since the epoch, for the records' timestamps and the timeouts.
        config: :class:`TxnConfig`.
        coordinator_epoch: written into every marker (Kafka's leader epoch of the state
            partition), so partitions refuse markers of an older coordinator.
        shared_lock: makes an exclusive lock over every process of the store (an flock): given,
            several processes may each run a coordinator over the same (shared) state log; see
            the module docstring's "Processes".

    Thread-safety: thread-safe; see the module docstring.
    """

    def __init__(self, state_log: "Log", new_producer_id: Callable[[], int], write_markers: WriteMarkers, *,
                 clock: Callable[[], int] = _wall_clock_ms, config: TxnConfig = TxnConfig(),
                 coordinator_epoch: int = 0,
                 shared_lock: Callable[[], ContextManager[Any]] | None = None) -> None:
        self._log = state_log
        self._new_producer_id = new_producer_id
        self._write_markers = write_markers
        self._clock = clock
        self.config = config
        self.coordinator_epoch = coordinator_epoch
        self._lock = threading.Lock()
        # The marker thread waits for work here, drain() for the jobs to end: one lock for all.
        self._changed = threading.Condition(self._lock)
        self._status = _NEW
        self._txns: dict[str, TransactionMetadata] = {}
        self._open: set[str] = set()  # ids whose state or pending state is open (_OPEN)
        self._tasks: list[tuple[float, int, _Task]] = []  # (due, seq, task): a heap on monotonic time
        self._seq = itertools.count()
        self._jobs = 0  # marker jobs not yet ended (completed, fenced or dropped)
        self._thread: threading.Thread | None = None
        # Several processes on one store (see the module docstring, "Processes"): every
        # operation holds the process's section lock and the store's flock, catches up with the
        # records the other processes wrote, and leaves with the log end as its position.
        self._shared_lock = shared_lock
        self._section_lock = threading.RLock()
        self._depth = 0
        self._position = 0
        #: transactional id -> (its Prepare* state written by another process, when first seen):
        #: completed here if it stays so past ``config.takeover_ms`` (the writer may have died)
        self._foreign_prepared: dict[str, tuple[TxnLogEntry, float]] = {}

    # ------------------------------------------------------------------ processes
    @contextmanager
    def _section(self) -> Iterator[None]:
        """Hold the state against the other processes (a no-op without ``shared_lock``): the
        process's section lock and the store's flock, caught up on entry with what the others
        wrote; on exit the position is the log end (this process's own records are known)."""
        if self._shared_lock is None:
            yield
            return
        with self._section_lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            with self._shared_lock():
                self._depth = 1
                try:
                    self._catch_up()
                    yield
                finally:
                    self._depth = 0
                    self._position = self._log.log_end_offset

    def _catch_up(self) -> None:
        """Take up the records other processes appended since this one's position (held: the
        section)."""
        end = self._log.log_end_offset
        if self._position >= end:
            return
        records = self._records(self._position, end)
        now = time.monotonic()
        with self._lock:
            for tid, entry in records:
                self._foreign_prepared.pop(tid, None)
                if entry is None or entry.state == _S.DEAD:
                    self._txns.pop(tid, None)
                    self._open.discard(tid)
                    continue
                meta = self._txns[tid] = TransactionMetadata.from_entry(tid, entry)
                self._track(meta)
                if entry.state in _PREPARED:
                    self._foreign_prepared[tid] = (entry, now)
        self._position = end

    def _take_over(self) -> None:
        """Complete the transactions another process prepared and left so past
        ``config.takeover_ms`` (it may have died between its Prepare record and its markers;
        markers written again are no-ops for partitions that have them). Runs on the marker
        thread, in the section."""
        jobs = []
        with self._section():
            deadline = time.monotonic() - self.config.takeover_ms / 1000.0
            with self._lock:
                for tid, (entry, seen) in list(self._foreign_prepared.items()):
                    meta = self._txns.get(tid)
                    if meta is None or meta.state != entry.state or meta.pending_transition_in_progress:
                        self._foreign_prepared.pop(tid, None)
                    elif seen <= deadline:
                        self._foreign_prepared.pop(tid, None)
                        jobs.append(self._prepare_markers(tid, meta, self._clock()))
        for job in jobs:
            logger.info("completing the %s of %s, prepared by another process", "commit" if job.commit else "abort",
                        job.transactional_id)
            self._schedule(_Task("send", job))

    # ------------------------------------------------------------------ life cycle
    def load(self) -> int:
        """Replay ``__transaction_state`` and start serving; return the number of transactional
        ids loaded. Every transaction found in PrepareCommit or PrepareAbort is completed
        (markers, then its Complete record) by the marker thread, which this starts.

        Raises:
            TxnRecordError: a record cannot be read (nothing is served: call load again once fixed).
            TxnCoordinatorError: called twice, or after close().
            LogstoreError / OSError: reading the log failed (load may be called again).

        Thread-safe: requests made meanwhile are answered COORDINATOR_LOAD_IN_PROGRESS.
        """
        with self._lock:
            if self._status != _NEW:
                raise TxnCoordinatorError(f"load() of a coordinator that is {self._status}")
            self._status = _LOADING
        started = time.monotonic()
        try:
            self._position = 2**63  # (the replay reads the whole log: no catch-up first)
            with self._section():
                loaded = self._replay()
        except BaseException:
            with self._lock:
                if self._status == _LOADING:
                    self._status = _NEW
            raise
        now = self._clock()
        jobs = []
        with self._lock:
            if self._status != _LOADING:
                return len(loaded)  # closed meanwhile
            self._txns = loaded
            self._open = {tid for tid, meta in loaded.items() if meta.state in _OPEN}
            for tid, meta in loaded.items():
                if meta.state in _PREPARED:
                    jobs.append(self._prepare_markers(tid, meta, now))
            self._status = _ACTIVE
            self._thread = threading.Thread(target=self._run, name="logstore-txn-markers", daemon=True)
            self._thread.start()
        self._schedule(_Task("abort_expired"), self.config.abort_timed_out_interval_ms / 1000.0)
        if self._shared_lock is not None:
            self._schedule(_Task("take_over"), self.config.takeover_ms / 1000.0)
        self._schedule(_Task("expire_ids"), self.config.expired_ids_interval_ms / 1000.0)
        for job in jobs:
            logger.info("completing %s (%s) of transactional id %s, found in %s",
                        "commit" if job.commit else "abort", sorted(job.remaining), job.transactional_id,
                        TRANSACTION_STATE_TOPIC)
            self._schedule(_Task("send", job))
        logger.info("loaded %d transactional ids from %s in %.0f ms (%d transactions to complete)", len(loaded),
                    TRANSACTION_STATE_TOPIC, (time.monotonic() - started) * 1000, len(jobs))
        return len(loaded)

    def _replay(self) -> dict[str, TransactionMetadata]:
        """Every transactional id's last state in the log (the last record per key; a tombstone removes it)."""
        loaded: dict[str, TransactionMetadata] = {}
        end = self._log.log_end_offset
        for tid, entry in self._records(self._log.log_start_offset, end):
            if entry is None or entry.state == _S.DEAD:
                loaded.pop(tid, None)
            else:
                loaded[tid] = TransactionMetadata.from_entry(tid, entry)
        self._position = end
        return loaded

    def _records(self, position: int, end: int) -> builtins.list[tuple[str, TxnLogEntry | None]]:
        """(transactional id, entry or None for a tombstone) of the records in [position, end)."""
        log = self._log
        out: builtins.list[tuple[str, TxnLogEntry | None]] = []
        while position < end:
            try:
                records = log.read(position, max_offset=end)
            except OffsetOutOfRangeError as exc:  # retention moved the start: everything live is after it
                position = exc.log_start_offset
                continue
            if not records:
                break
            for record in records:
                try:
                    if record.key is None:
                        raise TxnRecordError("a record without key")
                    tid = decode_txn_key(record.key)
                    if tid is None:
                        logger.warning("skipping the record at offset %d of %s: unknown key version", record.offset,
                                       TRANSACTION_STATE_TOPIC)
                        continue
                    entry = decode_txn_value(record.value)
                    if entry is not None and entry.state == _S.PREPARE_EPOCH_FENCE:
                        raise TxnRecordError(f"transactional id {tid!r} in state PrepareEpochFence, which is "
                                             "never written")
                except TxnRecordError as exc:
                    raise TxnRecordError(exc.detail, record.offset) from None
                out.append((tid, entry))
            position = records[-1].offset + 1
        return out

    def close(self) -> None:
        """Stop serving (every later request is COORDINATOR_NOT_AVAILABLE) and stop the marker
        thread; markers and Complete records not yet written are left to the next load. The
        state log stays open (its owner closes it). Idempotent; thread-safe."""
        with self._lock:
            if self._status == _CLOSED:
                return
            self._status = _CLOSED
            self._tasks.clear()
            self._jobs = 0
            self._changed.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)
            if thread.is_alive():
                logger.warning("the marker thread did not stop within 30 s (a state log write is stuck)")

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until no transaction is being completed (every marker and Complete record that
        was under way is written, fenced or given up); True when none is, False on timeout.
        For an orderly shutdown, and for tests. Thread-safe."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while self._jobs and self._status != _CLOSED:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def _unavailable(self) -> ErrorCode | None:
        """Why no request can be served now (held: the lock), or None."""
        if self._status == _ACTIVE:
            return None
        return ErrorCode.coordinator_not_available if self._status == _CLOSED else ErrorCode.coordinator_load_in_progress

    # ------------------------------------------------------------------ InitProducerId
    @_in_section
    def init_producer_id(self, transactional_id: str | None, txn_timeout_ms: int, expected_producer_id: int = -1,
                         expected_epoch: int = -1) -> tuple[int, int, int]:
        """InitProducerId: ``(error, producer_id, producer_epoch)`` (-1, -1 with an error).

        ``transactional_id`` None is an idempotent producer without transactions: a new
        producer id at epoch 0, nothing written. ``expected_producer_id`` and ``expected_epoch``
        (both -1, or both set) are what a producer recovering from an error has (KIP-360).

        Errors: INVALID_REQUEST (an empty id, or one of the expected pair without the other),
        INVALID_TRANSACTION_TIMEOUT, PRODUCER_FENCED, CONCURRENT_TRANSACTIONS (a transaction is
        completing; or the old producer's open transaction is being aborted: retry),
        COORDINATOR_LOAD_IN_PROGRESS, the state log's failure (NOT_COORDINATOR, UNKNOWN_SERVER_ERROR),
        or the allocator's.

        Durability: the new epoch is durable before it is answered. Thread-safe.
        """
        if transactional_id is None:
            try:
                return ErrorCode.none, self._new_producer_id(), 0
            except Exception as exc:
                logger.warning("producer id allocation failed: %s", exc)
                return code_for(exc), NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        if not transactional_id:
            return ErrorCode.invalid_request, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        if (expected_producer_id == NO_PRODUCER_ID) != (expected_epoch == NO_PRODUCER_EPOCH):
            return ErrorCode.invalid_request, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        expected = None if expected_producer_id == NO_PRODUCER_ID else (expected_producer_id, expected_epoch)
        if not 0 < txn_timeout_ms <= self.config.transaction_max_timeout_ms:
            return ErrorCode.invalid_transaction_timeout, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        # A new transactional id, or a rotation onto a new producer id, needs an id: it is
        # allocated without the lock (the allocator may do I/O) and the state looked at again.
        spare = NO_PRODUCER_ID
        outcome: TxnLogEntry | int | None = None
        for _ in range(3):
            with self._lock:
                error = self._unavailable()
                if error is not None:
                    return error, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
                now = self._clock()
                meta = self._txns.get(transactional_id)
                if meta is None and spare != NO_PRODUCER_ID:
                    meta = self._txns[transactional_id] = TransactionMetadata(
                        transactional_id, spare, NO_PRODUCER_EPOCH, txn_timeout_ms, _S.EMPTY,
                        txn_last_update_timestamp=now)
                    spare = NO_PRODUCER_ID
                outcome = None if meta is None else self._prepare_init(meta, txn_timeout_ms, expected, spare, now)
            if outcome is not None:
                break
            try:
                spare = self._new_producer_id()
            except Exception as exc:
                logger.warning("producer id allocation for %s failed: %s", transactional_id, exc)
                return code_for(exc), NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        if outcome is None:  # the state kept changing under us: let the client retry
            return ErrorCode.concurrent_transactions, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        if isinstance(outcome, int):
            return outcome, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        assert meta is not None
        entry = outcome
        if entry.state == _S.PREPARE_ABORT:  # the old producer's transaction is aborted first
            error = self._persist(transactional_id, meta, entry, fence=True)
            if error == ErrorCode.none:
                logger.info("aborting the open transaction of %s (fenced by a new producer)", transactional_id)
                return ErrorCode.concurrent_transactions, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
            return error, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        error = self._persist(transactional_id, meta, entry)
        if error != ErrorCode.none:
            return error, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        logger.debug("initialised %s: producer id %d, epoch %d", transactional_id, entry.producer_id,
                     entry.producer_epoch)
        return ErrorCode.none, entry.producer_id, entry.producer_epoch

    def _prepare_init(self, meta: TransactionMetadata, txn_timeout_ms: int, expected: tuple[int, int] | None,
                      spare: int, now: int) -> TxnLogEntry | int | None:
        """InitProducerId's transition (held: the lock): the entry to write (Empty, or
        PrepareAbort of a fenced transaction), an error code, or None: a new producer id is
        needed and ``spare`` is none."""
        if meta.pending_transition_in_progress:
            return ErrorCode.concurrent_transactions
        if expected is not None:
            producer_id, epoch = expected
            # KIP-360: fence unless the id was just created (no epoch yet), the producer has the
            # current id (its epoch is checked below), or it has the id before a rotation with
            # the exhausted epoch (a retry whose answer was lost).
            if not (meta.producer_epoch == NO_PRODUCER_EPOCH or producer_id == meta.producer_id
                    or (producer_id == meta.previous_producer_id and is_epoch_exhausted(epoch))):
                return ErrorCode.producer_fenced
        state = meta.state
        if state in _PREPARED:
            return ErrorCode.concurrent_transactions
        if state == _S.ONGOING:
            # Abort the open transaction with a bumped epoch that is never answered: the client
            # retries, and its epoch is bumped once more (onto a new producer id if exhausted).
            fence = meta.prepare_fence_producer_epoch()
            entry = meta.prepare_fenced_abort(fence, now)
            self._track(meta)
            return entry
        expected_epoch = None if expected is None else expected[1]
        if meta.needs_new_producer_id(expected_epoch) and spare == NO_PRODUCER_ID:
            return None
        try:
            return meta.prepare_init(txn_timeout_ms, now, expected_epoch, spare)
        except ProducerFencedError as exc:
            logger.info("%s", exc)
            return ErrorCode.producer_fenced

    # ------------------------------------------------------------------ AddPartitions / AddOffsets
    @_in_section
    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """AddPartitionsToTxn: ``{(topic, partition): error}``, one error for all of them.

        The caller (the server) has checked that the partitions exist and the client may write
        them. Errors: INVALID_REQUEST (an empty id), INVALID_PRODUCER_ID_MAPPING (unknown id, or
        another producer id), PRODUCER_FENCED (another epoch), CONCURRENT_TRANSACTIONS (a
        transition under way, the transaction completing, or ``max_ongoing`` transactions open
        already), COORDINATOR_LOAD_IN_PROGRESS, the state log's failure.

        Durability: durable before it is answered. Thread-safe.

        Raises:
            ValueError: a partition is not a (topic, partition >= 0) pair.
        """
        wanted = {_partition(tp) for tp in partitions}
        if not wanted:
            return {}
        error = self._add(transactional_id, producer_id, producer_epoch, wanted)
        return {tp: error for tp in wanted}

    @_in_section
    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str,
                    offsets_partition_for_group: Callable[[str], int]) -> int:
        """AddOffsetsToTxn: add the group's ``__consumer_offsets`` partition
        (``offsets_partition_for_group(group_id)``) to the transaction; the error, as
        :meth:`add_partitions`. Durable before it is answered. Thread-safe.

        Raises:
            ValueError: ``offsets_partition_for_group`` gave no partition number.
        """
        if not group_id:
            return ErrorCode.invalid_request
        tp = _partition((OFFSETS_TOPIC, offsets_partition_for_group(group_id)))
        return self._add(transactional_id, producer_id, producer_epoch, {tp})

    def _add(self, transactional_id: str, producer_id: int, producer_epoch: int,
             partitions: set[TopicPartition]) -> int:
        if not transactional_id:
            return ErrorCode.invalid_request
        with self._lock:
            error = self._unavailable()
            if error is not None:
                return error
            meta = self._txns.get(transactional_id)
            if meta is None or meta.producer_id != producer_id:
                return ErrorCode.invalid_producer_id_mapping
            if meta.producer_epoch != producer_epoch:
                return ErrorCode.producer_fenced
            if meta.pending_transition_in_progress or meta.state in _PREPARED:
                return ErrorCode.concurrent_transactions
            if meta.state == _S.ONGOING and partitions <= meta.topic_partitions:
                return ErrorCode.none  # nothing to write
            if (meta.state != _S.ONGOING and self.config.max_ongoing is not None
                    and len(self._open) >= self.config.max_ongoing):
                logger.info("refusing to open a transaction for %s: %d transactions are open (max_ongoing)",
                            transactional_id, len(self._open))
                return ErrorCode.concurrent_transactions
            entry = meta.prepare_add_partitions(partitions, self._clock())
            self._track(meta)
        return self._persist(transactional_id, meta, entry)

    @_in_section
    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Whether a transactional produce may write each partition (Kafka's
        handleVerifyPartitionsInTransaction): NONE for a partition of the producer's ongoing
        transaction, TRANSACTION_ABORTABLE for one not added; for all of them
        INVALID_PRODUCER_ID_MAPPING (unknown id or another producer id), PRODUCER_FENCED
        (another epoch), CONCURRENT_TRANSACTIONS (the transaction is completing),
        INVALID_REQUEST (an empty id), COORDINATOR_LOAD_IN_PROGRESS. Writes nothing.

        The produce path answers PRODUCER_FENCED as INVALID_PRODUCER_EPOCH, and
        TRANSACTION_ABORTABLE as INVALID_TXN_STATE to clients that do not know it (Kafka's
        AddPartitionsToTxnManager). Thread-safe.
        """
        wanted = {_partition(tp) for tp in partitions}
        if not transactional_id:
            return {tp: ErrorCode.invalid_request for tp in wanted}
        with self._lock:
            error = self._unavailable()
            meta = self._txns.get(transactional_id)
            if error is None:
                if meta is None or meta.producer_id != producer_id:
                    error = ErrorCode.invalid_producer_id_mapping
                elif meta.producer_epoch != producer_epoch:
                    error = ErrorCode.producer_fenced
                elif meta.state in _PREPARED:
                    error = ErrorCode.concurrent_transactions
            if error is not None:
                return {tp: error for tp in wanted}
            assert meta is not None
            return {tp: ErrorCode.none if tp in meta.topic_partitions else ErrorCode.transaction_abortable
                    for tp in wanted}

    # ------------------------------------------------------------------ EndTxn
    @_in_section
    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                commit: bool) -> "Future[int]":
        """EndTxn: commit (``commit``) or abort the ongoing transaction; a future of the error.

        The answer comes once PrepareCommit or PrepareAbort is durable (here, before end_txn
        returns: the record is written on the caller's thread); the markers and the Complete
        record follow on the marker thread. A retry after the outcome is decided: the same
        outcome while it completes is CONCURRENT_TRANSACTIONS, once complete NONE; the other
        outcome INVALID_TXN_STATE. Other errors: INVALID_REQUEST, INVALID_PRODUCER_ID_MAPPING,
        PRODUCER_FENCED, INVALID_TXN_STATE (no transaction), CONCURRENT_TRANSACTIONS (another
        transition under way), COORDINATOR_LOAD_IN_PROGRESS, the state log's failure.

        Thread-safe.
        """
        answer: Future[int] = Future()
        error, job = self._end_txn(transactional_id, producer_id, producer_epoch, commit)
        answer.set_result(error)  # Kafka answers before the markers are written
        if job is not None:
            self._schedule(_Task("send", job))
        return answer

    def _end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                 commit: bool) -> tuple[int, _MarkerJob | None]:
        if not transactional_id:
            return ErrorCode.invalid_request, None
        with self._lock:
            error = self._unavailable()
            if error is not None:
                return error, None
            meta = self._txns.get(transactional_id)
            if meta is None or meta.producer_id != producer_id:
                return ErrorCode.invalid_producer_id_mapping, None
            if meta.producer_epoch != producer_epoch:
                return ErrorCode.producer_fenced, None
            if meta.pending_transition_in_progress:
                return ErrorCode.concurrent_transactions, None
            state = meta.state
            if state == _S.ONGOING:
                target = _S.PREPARE_COMMIT if commit else _S.PREPARE_ABORT
                entry = meta.prepare_abort_or_commit(target, 0, NO_PRODUCER_ID, self._clock())
            elif state in (_S.COMPLETE_COMMIT, _S.COMPLETE_ABORT):
                # a retry of an EndTxn that completed: the same outcome is done, the other one cannot be
                return (ErrorCode.none if commit == (state == _S.COMPLETE_COMMIT)
                        else ErrorCode.invalid_txn_state), None
            elif state in _PREPARED:
                return (ErrorCode.concurrent_transactions if commit == (state == _S.PREPARE_COMMIT)
                        else ErrorCode.invalid_txn_state), None
            else:  # Empty: no transaction to end
                return ErrorCode.invalid_txn_state, None
        exc = self._append([(transactional_id, entry)])
        with self._lock:
            error = self._apply(transactional_id, meta, entry, exc)
            job = self._prepare_markers(transactional_id, meta, self._clock()) if error == ErrorCode.none else None
        return error, job

    # ------------------------------------------------------------------ timers
    @_in_section
    def abort_expired(self, now_ms: int | None = None) -> builtins.list[str]:
        """Abort every transaction open longer than its timeout (Kafka runs this every
        ``transaction.abort.timed.out.transaction.cleanup.interval.ms``, 10 s): its epoch is
        bumped (fencing its producer) and PrepareAbort written, then its markers. Returns the
        transactional ids whose abort was written. ``now_ms``: the clock's time by default.
        Thread-safe."""
        with self._lock:
            if self._unavailable() is not None:
                return []
            now = self._clock() if now_ms is None else now_ms
            items = []
            for tid, meta in self._txns.items():
                if (meta.state == _S.ONGOING and not meta.pending_transition_in_progress
                        and meta.txn_start_timestamp + meta.txn_timeout_ms < now):
                    fence = meta.prepare_fence_producer_epoch()
                    items.append((tid, meta, meta.prepare_fenced_abort(fence, now)))
        if not items:
            return []
        exc = self._append([(tid, entry) for tid, _, entry in items])
        aborted, jobs = [], []
        with self._lock:
            for tid, meta, entry in items:
                if self._apply(tid, meta, entry, exc, fence=True) == ErrorCode.none:
                    aborted.append(tid)
                    jobs.append(self._prepare_markers(tid, meta, now))
        for job in jobs:
            logger.info("aborting the transaction of %s (producer id %d): it passed its timeout",
                        job.transactional_id, job.producer_id)
            self._schedule(_Task("send", job))
        return aborted

    @_in_section
    def expire_ids(self, now_ms: int | None = None) -> builtins.list[str]:
        """Remove every transactional id idle (Empty, CompleteCommit or CompleteAbort, nothing
        pending) for ``transactional_id_expiration_ms``: a tombstone each, durable before the id
        is forgotten (Kafka runs this every hour). Returns the ids removed. ``now_ms``: the
        clock's time by default. Thread-safe."""
        with self._lock:
            if self._unavailable() is not None:
                return []
            now = self._clock() if now_ms is None else now_ms
            horizon = now - self.config.transactional_id_expiration_ms
            items = [(tid, meta, meta.prepare_dead()) for tid, meta in self._txns.items()
                     if meta.state.is_expiration_allowed and not meta.pending_transition_in_progress
                     and meta.txn_last_update_timestamp <= horizon]
        if not items:
            return []
        exc = self._append([(tid, entry) for tid, _, entry in items])
        removed = []
        with self._lock:
            for tid, meta, _ in items:
                if self._txns.get(tid) is not meta or meta.pending_state != _S.DEAD:
                    continue
                if exc is None:
                    del self._txns[tid]
                    self._open.discard(tid)
                    removed.append(tid)
                else:
                    meta.clear_pending()
        if removed:
            logger.info("expired %d transactional ids idle for %d ms", len(removed),
                        self.config.transactional_id_expiration_ms)
        return removed

    # ------------------------------------------------------------------ describe / list
    @_in_section
    def describe(self, transactional_ids: Iterable[str]) -> builtins.list[TxnDescription]:
        """DescribeTransactions: one :class:`TxnDescription` per id, in order
        (TRANSACTIONAL_ID_NOT_FOUND for an unknown or expiring id, INVALID_REQUEST for an empty
        one). Thread-safe."""
        out = []
        with self._lock:
            unavailable = self._unavailable()
            for tid in transactional_ids:
                meta = self._txns.get(tid)
                if unavailable is not None:
                    out.append(TxnDescription(tid, unavailable))
                elif not tid:
                    out.append(TxnDescription(tid, ErrorCode.invalid_request))
                elif meta is None or meta.state == _S.DEAD:
                    out.append(TxnDescription(tid, ErrorCode.transactional_id_not_found))
                else:
                    topics: dict[str, list[int]] = {}
                    for topic, partition in meta.topic_partitions:
                        topics.setdefault(topic, []).append(partition)
                    out.append(TxnDescription(
                        tid, ErrorCode.none, meta.state.kafka_name, meta.producer_id, meta.producer_epoch,
                        meta.txn_timeout_ms, meta.txn_start_timestamp,
                        tuple((topic, tuple(sorted(ps))) for topic, ps in sorted(topics.items()))))
        return out

    @_in_section
    def list(self, state_filters: Iterable[str] = (), producer_id_filters: Iterable[int] = (),
             min_duration_ms: int = -1, now_ms: int | None = None) -> TxnListing:
        """ListTransactions: the transactions in one of ``state_filters`` (Kafka's names; none:
        any state) of one of ``producer_id_filters`` (none: any producer), open for longer than
        ``min_duration_ms`` (-1: any; KIP-994), sorted by transactional id; filters naming no
        state are answered back in ``unknown_state_filters``. Thread-safe."""
        states, unknown = set(), []
        names = list(state_filters)
        for name in names:
            state = TransactionState.from_kafka_name(name)
            if state is None:
                unknown.append(name)
            else:
                states.add(state)
        producers = set(producer_id_filters)
        with self._lock:
            error = self._unavailable()
            if error is not None:
                return TxnListing(error)
            now = self._clock() if now_ms is None else now_ms
            found = tuple(
                ListedTxn(tid, meta.producer_id, meta.state.kafka_name) for tid, meta in sorted(self._txns.items())
                if meta.state != _S.DEAD and (not producers or meta.producer_id in producers)
                and (not names or meta.state in states)
                and not (min_duration_ms >= 0 and now - meta.txn_start_timestamp <= min_duration_ms))
        return TxnListing(ErrorCode.none, tuple(unknown), found)

    # ------------------------------------------------------------------ writes
    def _append(self, items: Sequence[tuple[str, TxnLogEntry]], sync: bool = True) -> BaseException | None:
        """Write the records of ``items`` in one batch and, with ``config.fsync`` and ``sync``,
        fsync them (without the lock); the failure, or None once they are written (durable)."""
        try:
            keys: list[bytes | None] = [encode_txn_key(tid) for tid, _ in items]
            values: list[bytes | None] = [None if entry.state == _S.DEAD else encode_txn_value(self._writable(entry),
                                          self.config.value_version) for _, entry in items]
            self._log.append_batch(values, keys)
            if self.config.fsync and sync:
                self._log.flush()
        except Exception as exc:
            logger.warning("writing %d records to %s failed: %s", len(items), TRANSACTION_STATE_TOPIC, exc,
                           exc_info=not isinstance(exc, (LogstoreError, OSError)))
            return exc
        return None

    def _writable(self, entry: TxnLogEntry) -> TxnLogEntry:
        """``entry`` as the configured value version can hold it (version 0 has no tagged fields)."""
        if self.config.value_version >= 1:
            return entry
        return entry._replace(previous_producer_id=NO_PRODUCER_ID, next_producer_id=NO_PRODUCER_ID,
                              client_transaction_version=0)

    def _persist(self, transactional_id: str, meta: TransactionMetadata, entry: TxnLogEntry,
                 fence: bool = False) -> int:
        """Write ``entry`` durably and apply it: the error code. For InitProducerId and
        AddPartitions; the markers of a fenced abort are scheduled here."""
        exc = self._append([(transactional_id, entry)])
        with self._lock:
            error = self._apply(transactional_id, meta, entry, exc, fence)
            job = (self._prepare_markers(transactional_id, meta, self._clock())
                   if error == ErrorCode.none and entry.state in _PREPARED else None)
        if job is not None:
            self._schedule(_Task("send", job))
        return error

    def _apply(self, transactional_id: str, meta: TransactionMetadata, entry: TxnLogEntry,
               exc: BaseException | None, fence: bool = False) -> int:
        """Complete (``exc`` None) or give up the pending transition to ``entry`` (held: the lock)."""
        if self._status == _CLOSED or self._txns.get(transactional_id) is not meta or meta.pending_state != entry.state:
            return ErrorCode.coordinator_not_available  # closed meanwhile: the next load sees the record
        if exc is None:
            meta.complete_transition(entry)
            self._track(meta)
            return ErrorCode.none
        meta.clear_pending(failed_epoch_fence=fence)
        self._track(meta)
        return self._error_for(exc)

    @staticmethod
    def _error_for(exc: BaseException) -> int:
        """The error a client gets when a record could not be written, as Kafka maps the
        append's errors (TransactionStateManager.appendTransactionToLog): a storage failure (the
        log closed, offline, an I/O error) or a lost leadership of a replicated state log is
        NOT_COORDINATOR, which clients retry after looking the coordinator up again; a write a
        majority did not confirm in time COORDINATOR_NOT_AVAILABLE (retried); anything else (a
        record too large included) UNKNOWN_SERVER_ERROR."""
        if isinstance(exc, (LogClosedError, LogOfflineError, NotLeaderOrFollowerError, OSError)):
            return ErrorCode.not_coordinator
        if isinstance(exc, RequestTimedOutError):
            return ErrorCode.coordinator_not_available
        return ErrorCode.unknown_server_error

    def _track(self, meta: TransactionMetadata) -> None:
        """Count ``meta`` as open or not, for ``max_ongoing`` (held: the lock)."""
        if meta.state in _OPEN or meta.pending_state in _OPEN:
            self._open.add(meta.transactional_id)
        else:
            self._open.discard(meta.transactional_id)

    # ------------------------------------------------------------------ markers
    def _prepare_markers(self, transactional_id: str, meta: TransactionMetadata, now: int) -> _MarkerJob:
        """The job completing ``meta``'s prepared transaction (held: the lock); it counts as
        under way (see :meth:`drain`) until it ends."""
        complete = meta.prepare_complete(now)
        self._jobs += 1
        return _MarkerJob(transactional_id, meta, meta.state == _S.PREPARE_COMMIT, meta.producer_id,
                          meta.producer_epoch, complete, set(meta.topic_partitions))

    def _schedule(self, task: _Task, delay_s: float = 0.0) -> None:
        with self._lock:
            if self._status == _CLOSED:
                return
            heapq.heappush(self._tasks, (time.monotonic() + delay_s, next(self._seq), task))
            self._changed.notify_all()

    def _backoff_s(self, attempt: int) -> float:
        ms = min(self.config.retry_backoff_ms * 2 ** min(attempt - 1, 30), self.config.retry_backoff_max_ms)
        return ms / 1000.0

    def _end_job(self, job: _MarkerJob) -> None:
        """The job is over (held: the lock)."""
        if self._status != _CLOSED:
            self._jobs -= 1
            self._changed.notify_all()

    def _valid(self, job: _MarkerJob) -> bool:
        """The job still completes the transaction it was made for (held: the lock)."""
        return (self._status == _ACTIVE and self._txns.get(job.transactional_id) is job.metadata
                and job.metadata.pending_state == job.complete.state)

    def _run(self) -> None:
        """The marker thread: sends markers, takes their results, writes Complete records (a
        batch of them per round, one fsync)."""
        while True:
            with self._lock:
                while self._status != _CLOSED and (not self._tasks or self._tasks[0][0] > time.monotonic()):
                    self._changed.wait(None if not self._tasks else self._tasks[0][0] - time.monotonic())
                if self._status == _CLOSED:
                    return
                now = time.monotonic()
                due = []
                while self._tasks and self._tasks[0][0] <= now:
                    due.append(heapq.heappop(self._tasks)[2])
            try:
                completions = []
                for task in due:
                    if task.kind == "abort_expired":
                        self._schedule(task, self.config.abort_timed_out_interval_ms / 1000.0)
                        self.abort_expired()
                        continue
                    if task.kind == "take_over":
                        self._schedule(task, self.config.takeover_ms / 2000.0)
                        self._take_over()
                        continue
                    if task.kind == "expire_ids":
                        self._schedule(task, self.config.expired_ids_interval_ms / 1000.0)
                        self.expire_ids()
                        continue
                    assert task.job is not None
                    if task.kind == "send":
                        self._send(task.job)
                    elif task.kind == "result":
                        assert task.future is not None
                        if self._take_result(task.job, task.future):
                            completions.append(task.job)
                    else:
                        completions.append(task.job)
                if completions:
                    self._write_completions(completions)
            except Exception:  # a bug: log it, keep the thread serving the other transactions
                logger.exception("the transaction marker thread failed a round")

    @_in_section
    def _send(self, job: _MarkerJob) -> None:
        with self._lock:
            if not self._valid(job):
                self._end_job(job)
                return
            partitions = sorted(job.remaining)
        if not partitions:
            self._schedule(_Task("complete", job))
            return
        try:
            future = self._write_markers(job.producer_id, job.producer_epoch, job.commit, self.coordinator_epoch,
                                         partitions)
        except Exception as exc:
            logger.warning("writing the %s markers of %s failed: %s", "commit" if job.commit else "abort",
                           job.transactional_id, exc, exc_info=True)
            future = Future()
            future.set_exception(exc)
        future.add_done_callback(lambda done, job=job: self._schedule(_Task("result", job, done)))

    @_in_section
    def _take_result(self, job: _MarkerJob, future: "Future[dict[TopicPartition, int]]") -> bool:
        """Apply a marker write's result; True when every marker is written (the Complete record is next)."""
        try:
            results = dict(future.result())
            failure = None
        except Exception as exc:
            results, failure = {}, exc
        with self._lock:
            if not self._valid(job):
                self._end_job(job)
                return False
            meta = job.metadata
            retry = False
            for tp in sorted(job.remaining):
                error = results.get(tp)
                if error == ErrorCode.none or error in _MARKER_DROPPED:
                    if error != ErrorCode.none:
                        logger.info("%s: no marker needed in %s-%d (%s)", job.transactional_id, tp[0], tp[1],
                                    ErrorCode(error).name)
                    job.remaining.discard(tp)
                    meta.remove_partition(tp)
                elif error in _MARKER_FENCED:
                    # A newer producer epoch or coordinator wrote to the partition: this coordinator's
                    # view is stale. Stop, as Kafka does; the transaction stays prepared until a load.
                    logger.warning("%s: the %s marker for %s-%d was refused (%s): giving up its completion",
                                   job.transactional_id, "commit" if job.commit else "abort", tp[0], tp[1],
                                   ErrorCode(error).name)
                    self._end_job(job)
                    return False
                else:
                    retry = True
                    if error is None and failure is None:
                        logger.warning("%s: the marker write did not answer for %s-%d; retrying",
                                       job.transactional_id, tp[0], tp[1])
                    elif error is not None and error not in _MARKER_RETRIABLE:
                        logger.error("%s: unexpected error %s writing a marker to %s-%d; retrying",
                                     job.transactional_id, _name(error), tp[0], tp[1])
            if failure is not None:
                logger.warning("%s: writing markers failed: %s; retrying", job.transactional_id, failure)
            if not retry:
                return True
            job.attempt += 1
            delay = self._backoff_s(job.attempt)
        self._schedule(_Task("send", job), delay)
        return False

    @_in_section
    def _write_completions(self, jobs: builtins.list[_MarkerJob]) -> None:
        with self._lock:
            live = [job for job in jobs if self._valid(job)]
            for job in jobs:
                if job not in live:
                    self._end_job(job)
        if not live:
            return
        # (no fsync: a Complete record lost to power loss leaves the Prepare record, and the
        # next load writes the markers again, which partitions take as no-ops)
        exc = self._append([(job.transactional_id, job.complete) for job in live], sync=False)
        retries = []
        with self._lock:
            for job in live:
                if not self._valid(job):
                    self._end_job(job)
                elif exc is None:
                    job.metadata.complete_transition(job.complete)
                    self._track(job.metadata)
                    self._end_job(job)
                    logger.debug("completed the %s of %s", "commit" if job.commit else "abort", job.transactional_id)
                elif isinstance(exc, (LogClosedError, LogOfflineError, NotLeaderOrFollowerError)):
                    # The state log is gone (or led by another node now): nothing more can be
                    # written here; the next load completes it.
                    logger.error("%s: cannot write its %s record (%s): left to the next load", job.transactional_id,
                                 job.complete.state.kafka_name, exc)
                    self._end_job(job)
                else:
                    job.attempt += 1
                    retries.append((job, self._backoff_s(job.attempt)))
        for job, delay in retries:
            self._schedule(_Task("complete", job), delay)


def _name(error: int) -> str:
    try:
        return ErrorCode(error).name
    except ValueError:
        return f"error {error}"
