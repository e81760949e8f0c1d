"""A transactional id's state as Kafka keeps it in ``__transaction_state``: the states, the record, the metadata.

The states and their ids are Kafka's (``TransactionState``); a state may be entered only from
its valid previous states (:data:`VALID_PREVIOUS_STATES`):

=================  ==  ==========================================
state              id  entered from
=================  ==  ==========================================
Empty               0  Empty, CompleteCommit, CompleteAbort
Ongoing             1  Ongoing, Empty, CompleteCommit, CompleteAbort
PrepareCommit       2  Ongoing
PrepareAbort        3  Ongoing, PrepareEpochFence
CompleteCommit      4  PrepareCommit
CompleteAbort       5  PrepareAbort
Dead                6  Empty, CompleteCommit, CompleteAbort
PrepareEpochFence   7  Ongoing
=================  ==  ==========================================

Dead and PrepareEpochFence are never written: Dead is written as a tombstone (the id expired),
and PrepareEpochFence is only ever a pending state on the way to PrepareAbort.

The record, in the schemas of Kafka's ``TransactionLogKey.json`` and ``TransactionLogValue.json``
(both prefixed with their int16 version, as Kafka's ``MessageUtil.toVersionPrefixedBytes``):

* key, version 0: ``int16 version=0, string transactional_id``
* value, version 0: ``int16 version=0, int64 producer_id, int16 producer_epoch, int32
  txn_timeout_ms, int8 state, [nullable] array partitions of (string topic, array of int32
  partition), int64 txn_last_update_timestamp, int64 txn_start_timestamp``
* value, version 1 (flexible): the same fields, with compact strings and arrays (unsigned varint
  length + 1, 0 for null), an empty tagged-field section after each partitions entry, and at the
  end the tagged fields 0 ``int64 previous_producer_id`` (default -1), 1 ``int64
  next_producer_id`` (default -1), 2 ``int16 client_transaction_version`` (default 0), each
  written only when it differs from its default, in tag order (as Kafka's generated writer)
* a null value (tombstone) deletes the transactional id (it expired).

Strings are ``int16 length`` + UTF-8 in version 0, integers big-endian. An Empty transaction's
partitions are written as null and ignored on reading, as Kafka does; the partitions of one
topic are grouped in one entry, topics and partitions sorted (Kafka's order is a hash map's).

:class:`TransactionMetadata` is Kafka's in-memory state of one transactional id, with its
transitions in two steps, as Kafka's: a ``prepare_*`` method checks the transition and returns
the target :class:`TxnLogEntry` (recording the target state as pending, which refuses any other
transition meanwhile); the caller writes that entry to ``__transaction_state`` and, once it is
durable, applies it with :meth:`TransactionMetadata.complete_transition`, or gives it up with
:meth:`TransactionMetadata.clear_pending` when the write failed.

Thread-safety: the codec functions and :class:`TxnLogEntry` are pure and immutable;
:class:`TransactionMetadata` is not thread-safe (its owner, the coordinator, guards it with its lock).
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Iterable, NamedTuple

from ..errors import CorruptRecordError, LogstoreError, ProducerFencedError
from ..records.control import uvarint

__all__ = [
    "TRANSACTION_STATE_TOPIC", "TRANSACTION_STATE_TOPIC_CONFIG", "TRANSACTION_MAX_TIMEOUT_MS",
    "TRANSACTIONAL_ID_EXPIRATION_MS", "ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS",
    "REMOVE_EXPIRED_TRANSACTIONAL_ID_CLEANUP_INTERVAL_MS", "NO_PRODUCER_ID", "NO_PRODUCER_EPOCH",
    "MAX_PRODUCER_EPOCH", "TXN_KEY_VERSION", "TXN_VALUE_VERSIONS", "TransactionState", "VALID_PREVIOUS_STATES",
    "TxnLogEntry", "TransactionMetadata", "TxnRecordError", "IllegalTxnTransitionError",
    "encode_txn_key", "decode_txn_key", "encode_txn_value", "decode_txn_value", "is_epoch_exhausted",
]

#: Kafka's internal topic of transaction state (a compacted topic: the last record per
#: transactional id is its state).
TRANSACTION_STATE_TOPIC = "__transaction_state"
#: Settings of the transaction state topic, as Kafka enforces them (``transactionTopicConfigs``:
#: compacted, uncompressed, ``transaction.state.log.segment.bytes`` 100 MiB).
TRANSACTION_STATE_TOPIC_CONFIG = dict(cleanup_policy="compact", compression_type="uncompressed",
                                      segment_bytes=100 * 1024 * 1024, min_cleanable_dirty_ratio=0.5)
#: Kafka's ``transaction.max.timeout.ms``: the largest transaction timeout a producer may ask for.
TRANSACTION_MAX_TIMEOUT_MS = 900_000
#: Kafka's ``transactional.id.expiration.ms``: an id idle (Empty or Complete*) this long expires.
TRANSACTIONAL_ID_EXPIRATION_MS = 604_800_000
#: Kafka's ``transaction.abort.timed.out.transaction.cleanup.interval.ms``: how often to abort
#: the transactions past their timeout.
ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS = 10_000
#: Kafka's ``transaction.remove.expired.transaction.cleanup.interval.ms``: how often to expire
#: idle transactional ids.
REMOVE_EXPIRED_TRANSACTIONAL_ID_CLEANUP_INTERVAL_MS = 3_600_000
#: Kafka's RecordBatch.NO_PRODUCER_ID and NO_PRODUCER_EPOCH.
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
#: The largest producer epoch (Short.MaxValue). A producer is never given it: an epoch from
#: MAX_PRODUCER_EPOCH - 1 on is exhausted, so the coordinator can always fence with one more.
MAX_PRODUCER_EPOCH = 32767
TXN_KEY_VERSION = 0
TXN_VALUE_VERSIONS = (0, 1)

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
#: value fields up to the partitions: version, producer id, epoch, timeout, state
_HEAD = struct.Struct(">hqhib")
_TIMES = struct.Struct(">qq")
_TAG_PREVIOUS_PRODUCER_ID = 0
_TAG_NEXT_PRODUCER_ID = 1
_TAG_CLIENT_TRANSACTION_VERSION = 2
#: The transaction version (Kafka's ``transaction.version`` feature level) from which every
#: EndTxn bumps the producer epoch (KIP-890, ``TransactionVersion.supportsEpochBump``).
_EPOCH_BUMP_VERSION = 2


class TxnRecordError(CorruptRecordError):
    """A ``__transaction_state`` record that cannot be read: truncated, trailing bytes, a bad
    length or state id, or a value version this code does not know. Immutable; safe to share.

    Attributes:
        detail: what is wrong, in words (``reason`` adds the topic and the offset).
        offset: the record's offset in ``__transaction_state``, or None when unknown (the codec
            does not know it; the coordinator's load adds it).
    """

    def __init__(self, detail: str, offset: int | None = None) -> None:
        self.detail = detail
        self.offset = offset
        where = "" if offset is None else f" at offset {offset}"
        super().__init__(None, None, f"{TRANSACTION_STATE_TOPIC} record{where}: {detail}")

    def __reduce__(self):  # type: ignore[no-untyped-def]  # pickling keeps this class's arguments
        return (type(self), (self.detail, self.offset))


class IllegalTxnTransitionError(LogstoreError):
    """A transition the state machine forbids (Kafka's IllegalStateException in
    TransactionMetadata): a bug in the caller, never a client's mistake. Immutable; safe to share."""


class TransactionState(IntEnum):
    """A transaction's state, with Kafka's ids (the record's int8) and names (:attr:`kafka_name`,
    what DescribeTransactions and ListTransactions show). Immutable; safe to share.

    >>> TransactionState(2).kafka_name
    'PrepareCommit'
    >>> TransactionState.from_kafka_name("CompleteAbort")
    <TransactionState.COMPLETE_ABORT: 5>
    """

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """Kafka's name of the state ("PrepareCommit")."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @classmethod
    def from_kafka_name(cls, name: str) -> "TransactionState | None":
        """The state Kafka names ``name``; None for a name Kafka does not know."""
        for state in cls:
            if state.kafka_name == name:
                return state
        return None

    @property
    def valid_previous_states(self) -> frozenset["TransactionState"]:
        """The states this one may be entered from (Kafka's ``validPreviousStates``)."""
        return VALID_PREVIOUS_STATES[self]

    @property
    def is_expiration_allowed(self) -> bool:
        """True for the states in which an idle transactional id may expire (Empty, CompleteCommit, CompleteAbort)."""
        return self in (TransactionState.EMPTY, TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)


_S = TransactionState
#: Each state and the states it may be entered from (Kafka's ``validPreviousStates``).
VALID_PREVIOUS_STATES: dict[TransactionState, frozenset[TransactionState]] = {
    _S.EMPTY: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.ONGOING: frozenset({_S.ONGOING, _S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_COMMIT: frozenset({_S.ONGOING}),
    _S.PREPARE_ABORT: frozenset({_S.ONGOING, _S.PREPARE_EPOCH_FENCE}),
    _S.COMPLETE_COMMIT: frozenset({_S.PREPARE_COMMIT}),
    _S.COMPLETE_ABORT: frozenset({_S.PREPARE_ABORT}),
    _S.DEAD: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_EPOCH_FENCE: frozenset({_S.ONGOING}),
}
_PREPARED = frozenset({_S.PREPARE_COMMIT, _S.PREPARE_ABORT})
_COMPLETED = frozenset({_S.COMPLETE_COMMIT, _S.COMPLETE_ABORT})


def is_epoch_exhausted(producer_epoch: int) -> bool:
    """True when a producer id has no epoch left to give a producer (epoch >= 32766): the
    coordinator keeps the last one to fence with. Pure."""
    return producer_epoch >= MAX_PRODUCER_EPOCH - 1


class TxnLogEntry(NamedTuple):
    """One state of a transactional id: the value of its ``__transaction_state`` record, and the
    target of a transition (Kafka's TxnTransitMetadata). Immutable; safe to share between threads.

    ``last_producer_epoch`` is not in the record (Kafka does not write it): it is -1 when read.
    ``previous_producer_id``, ``next_producer_id`` and ``client_transaction_version`` are only in
    version 1 of the value (tagged fields): version 0 reads them as -1, -1 and 0.
    """

    producer_id: int
    producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState
    topic_partitions: frozenset[tuple[str, int]] = frozenset()
    txn_start_timestamp: int = -1
    txn_last_update_timestamp: int = -1
    previous_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    client_transaction_version: int = 0


# ---------------------------------------------------------------------------------------- codec
def _utf8(text: str, what: str) -> bytes:
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, got {type(text).__name__}")
    raw = text.encode("utf-8")
    if len(raw) > 32767:
        raise ValueError(f"{what} of {len(raw)} bytes does not fit Kafka's int16 string length")
    return raw


def encode_txn_key(transactional_id: str) -> bytes:
    """The ``__transaction_state`` key of ``transactional_id`` (Kafka's TransactionLogKey, version 0). Pure.

    >>> encode_txn_key("tx")
    b'\\x00\\x00\\x00\\x02tx'
    """
    raw = _utf8(transactional_id, "transactional id")
    return _I16.pack(TXN_KEY_VERSION) + _I16.pack(len(raw)) + raw


def _grouped(partitions: Iterable[tuple[str, int]]) -> list[tuple[str, list[int]]]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return [(topic, sorted(by_topic[topic])) for topic in sorted(by_topic)]


def encode_txn_value(entry: TxnLogEntry, version: int = 1) -> bytes:
    """The ``__transaction_state`` value of ``entry`` (Kafka's TransactionLogValue at ``version``, 0 or 1). Pure.

    Raises:
        ValueError: an unknown version; an Empty entry with partitions (Kafka refuses to write
            one); at version 0, a previous or next producer id or a client transaction version
            other than its default (Kafka's UnsupportedVersionException: they need version 1);
            a number out of its field's range.
    """
    if version not in TXN_VALUE_VERSIONS:
        raise ValueError(f"TransactionLogValue version {version} is not one of {TXN_VALUE_VERSIONS}")
    state = TransactionState(entry.state)
    if state == _S.EMPTY and entry.topic_partitions:
        raise ValueError(f"an Empty transaction has no partitions, got {sorted(entry.topic_partitions)}")
    groups = None if state == _S.EMPTY else _grouped(entry.topic_partitions)
    tagged: list[tuple[int, bytes]] = []
    for tag, default, fmt, value in ((_TAG_PREVIOUS_PRODUCER_ID, NO_PRODUCER_ID, _I64, entry.previous_producer_id),
                                     (_TAG_NEXT_PRODUCER_ID, NO_PRODUCER_ID, _I64, entry.next_producer_id),
                                     (_TAG_CLIENT_TRANSACTION_VERSION, 0, _I16, entry.client_transaction_version)):
        if value != default:  # Kafka's writer leaves a tagged field at its default out
            tagged.append((tag, _pack(fmt, value, f"tagged field {tag}")))
    if version == 0 and tagged:
        raise ValueError(f"TransactionLogValue version 0 cannot hold tagged fields {[t for t, _ in tagged]} "
                         "(previous/next producer id, client transaction version): write version 1")
    try:
        parts = [_HEAD.pack(version, entry.producer_id, entry.producer_epoch, entry.txn_timeout_ms, state)]
    except struct.error as exc:
        raise ValueError(f"a field of {entry} is out of range: {exc}") from None
    if version == 0:
        parts.append(_I32.pack(-1 if groups is None else len(groups)))
        for topic, ids in groups or ():
            raw = _utf8(topic, "topic")
            parts += [_I16.pack(len(raw)), raw, _I32.pack(len(ids))]
            parts += [_pack(_I32, p, "partition") for p in ids]
    else:
        parts.append(uvarint(0 if groups is None else len(groups) + 1))
        for topic, ids in groups or ():
            raw = _utf8(topic, "topic")
            parts += [uvarint(len(raw) + 1), raw, uvarint(len(ids) + 1)]
            parts += [_pack(_I32, p, "partition") for p in ids]
            parts.append(b"\x00")  # the entry's tagged fields: none
    parts.append(_pack(_TIMES, (entry.txn_last_update_timestamp, entry.txn_start_timestamp), "timestamps"))
    if version >= 1:
        parts.append(uvarint(len(tagged)))
        for tag, data in tagged:
            parts += [uvarint(tag), uvarint(len(data)), data]
    return b"".join(parts)


def _pack(fmt: struct.Struct, value: int | tuple[int, ...], what: str) -> bytes:
    try:
        return fmt.pack(*value) if isinstance(value, tuple) else fmt.pack(value)
    except struct.error as exc:
        raise ValueError(f"{what} {value!r} is out of range: {exc}") from None


class _Reader:
    """Bounds-checked reads of one key or value; every failure names the field."""

    def __init__(self, buf: bytes, what: str) -> None:
        self.buf = bytes(buf)
        self.pos = 0
        self.what = what

    def fail(self, reason: str) -> TxnRecordError:
        return TxnRecordError(f"{self.what}: {reason}")

    def need(self, n: int, field: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise self.fail(f"{field} runs past its end ({n} bytes at position {self.pos} of {len(self.buf)})")

    def fixed(self, fmt: struct.Struct, field: str) -> int:
        self.need(fmt.size, field)
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return int(value)

    def uvarint(self, field: str) -> int:
        value = shift = 0
        for i in range(5):
            self.need(1, field)
            byte = self.buf[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if value > 0xFFFFFFFF:
                    break
                return value
            shift += 7
        raise self.fail(f"{field}: unsigned varint longer than 5 bytes or above 2^32")

    def text(self, raw_length: int, field: str) -> str:
        self.need(raw_length, field)
        raw = self.buf[self.pos:self.pos + raw_length]
        self.pos += raw_length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{field} is not UTF-8: {exc}") from None

    def string(self, field: str) -> str:
        n = self.fixed(_I16, f"{field} length")
        if n < 0:
            raise self.fail(f"{field} length {n}: the field is not nullable")
        return self.text(n, field)

    def compact_string(self, field: str) -> str:
        n = self.uvarint(f"{field} length") - 1
        if n < 0:
            raise self.fail(f"{field} is null: the field is not nullable")
        return self.text(n, field)

    def count(self, n: int, field: str, min_size: int) -> int:
        """``n`` checked as the number of elements of at least ``min_size`` bytes left to read."""
        if n < 0:
            raise self.fail(f"{field} count {n}: null or negative, and the field is not nullable")
        if n * min_size > len(self.buf) - self.pos:
            raise self.fail(f"{field} count {n} does not fit the {len(self.buf) - self.pos} bytes left")
        return n

    def skip_tagged_fields(self, field: str) -> None:
        for _ in range(self.count(self.uvarint(f"{field} tagged field count"), f"{field} tagged field", 2)):
            self.uvarint(f"{field} tag")
            size = self.uvarint(f"{field} tagged field size")
            self.need(size, f"{field} tagged field")
            self.pos += size

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise self.fail(f"{len(self.buf) - self.pos} bytes after its last field")


def decode_txn_key(key: bytes) -> str | None:
    """The transactional id of a ``__transaction_state`` key; None for a key version other than
    0 (skipped when loading, as Kafka's UnknownKey). Pure.

    Raises:
        TxnRecordError: a version 0 key that is truncated, has trailing bytes or is not UTF-8.
    """
    reader = _Reader(key, "key")
    if reader.fixed(_I16, "version") != TXN_KEY_VERSION:
        return None
    transactional_id = reader.string("transactional id")
    reader.end()
    return transactional_id


def decode_txn_value(value: bytes | None) -> TxnLogEntry | None:
    """The state a ``__transaction_state`` value holds (versions 0 and 1); None for a
    tombstone (the transactional id expired). Pure.

    Unknown tagged fields are skipped, as Kafka's reader keeps them aside; an Empty state's
    partitions are ignored, and null partitions of another state read as none.

    Raises:
        TxnRecordError: the value is truncated, has trailing bytes, a bad length, an unknown
            state id, a known tagged field of the wrong size, or a version other than 0 and 1
            (Kafka refuses those too).
    """
    if value is None:
        return None
    reader = _Reader(value, "value")
    version = reader.fixed(_I16, "version")
    if version not in TXN_VALUE_VERSIONS:
        raise reader.fail(f"version {version} is not supported (versions {TXN_VALUE_VERSIONS} are)")
    producer_id = reader.fixed(_I64, "producer id")
    producer_epoch = reader.fixed(_I16, "producer epoch")
    timeout_ms = reader.fixed(_I32, "transaction timeout")
    state_id = reader.fixed(_I8, "transaction status")
    try:
        state = TransactionState(state_id)
    except ValueError:
        raise reader.fail(f"transaction status {state_id} is not a state (0 to 7)") from None
    partitions: set[tuple[str, int]] = set()
    if version == 0:
        n = reader.fixed(_I32, "partitions count")
        for _ in range(0 if n == -1 else reader.count(n, "partitions", 6)):
            topic = reader.string("topic")
            ids = reader.count(reader.fixed(_I32, "partition ids count"), "partition ids", 4)
            partitions.update((topic, reader.fixed(_I32, "partition id")) for _ in range(ids))
    else:
        n = reader.uvarint("partitions count") - 1
        for _ in range(0 if n == -1 else reader.count(n, "partitions", 3)):
            topic = reader.compact_string("topic")
            ids = reader.count(reader.uvarint("partition ids count") - 1, "partition ids", 4)
            partitions.update((topic, reader.fixed(_I32, "partition id")) for _ in range(ids))
            reader.skip_tagged_fields("partitions entry")
    last_update = reader.fixed(_I64, "last update timestamp")
    start = reader.fixed(_I64, "start timestamp")
    previous_id = next_id = NO_PRODUCER_ID
    client_version = 0
    if version >= 1:
        for _ in range(reader.count(reader.uvarint("tagged field count"), "tagged field", 2)):
            tag = reader.uvarint("tag")
            size = reader.uvarint(f"tagged field {tag} size")
            known = {_TAG_PREVIOUS_PRODUCER_ID: _I64, _TAG_NEXT_PRODUCER_ID: _I64,
                     _TAG_CLIENT_TRANSACTION_VERSION: _I16}.get(tag)
            if known is None:
                reader.need(size, f"tagged field {tag}")
                reader.pos += size
                continue
            if size != known.size:
                raise reader.fail(f"tagged field {tag} has {size} bytes, expected {known.size}")
            found = reader.fixed(known, f"tagged field {tag}")
            if tag == _TAG_PREVIOUS_PRODUCER_ID:
                previous_id = found
            elif tag == _TAG_NEXT_PRODUCER_ID:
                next_id = found
            else:
                client_version = found
    reader.end()
    return TxnLogEntry(producer_id, producer_epoch, timeout_ms, state,
                       frozenset() if state == _S.EMPTY else frozenset(partitions), start, last_update,
                       previous_id, next_id, NO_PRODUCER_EPOCH, client_version)


# ------------------------------------------------------------------------------------- metadata
class TransactionMetadata:
    """One transactional id's state in memory, and its transitions (Kafka's TransactionMetadata).

    Attributes (Kafka's): ``transactional_id``; ``producer_id`` and ``producer_epoch`` in use;
    ``previous_producer_id`` (the id before the last transition: the old id after a rotation);
    ``next_producer_id`` (KIP-890: the id to move to when the epoch is exhausted at EndTxn);
    ``last_producer_epoch`` (the epoch before the last InitProducerId bump, so that its retry is
    answered again; not kept across a restart); ``txn_timeout_ms``; ``state``;
    ``topic_partitions`` (the partitions of the ongoing transaction; while it completes, those
    still waiting for their marker); ``txn_start_timestamp`` (-1: none);
    ``txn_last_update_timestamp``; ``client_transaction_version``; ``pending_state`` (the
    target of a prepared transition not yet applied, or None); ``has_failed_epoch_fence`` (an
    epoch fence's write failed: the next fence does not bump the epoch again).

    Not thread-safe: the coordinator guards every instance with its lock.
    """

    def __init__(self, transactional_id: str, producer_id: int, producer_epoch: int = NO_PRODUCER_EPOCH,
                 txn_timeout_ms: int = 60_000, state: TransactionState = _S.EMPTY,
                 topic_partitions: Iterable[tuple[str, int]] = (), txn_start_timestamp: int = -1,
                 txn_last_update_timestamp: int = -1, previous_producer_id: int = NO_PRODUCER_ID,
                 next_producer_id: int = NO_PRODUCER_ID, last_producer_epoch: int = NO_PRODUCER_EPOCH,
                 client_transaction_version: int = 0) -> None:
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.previous_producer_id = previous_producer_id
        self.next_producer_id = next_producer_id
        self.producer_epoch = producer_epoch
        self.last_producer_epoch = last_producer_epoch
        self.txn_timeout_ms = txn_timeout_ms
        self.state = TransactionState(state)
        self.topic_partitions: set[tuple[str, int]] = set(topic_partitions)
        self.txn_start_timestamp = txn_start_timestamp
        self.txn_last_update_timestamp = txn_last_update_timestamp
        self.client_transaction_version = client_transaction_version
        self.pending_state: TransactionState | None = None
        self.has_failed_epoch_fence = False

    @classmethod
    def from_entry(cls, transactional_id: str, entry: TxnLogEntry) -> "TransactionMetadata":
        """The metadata a loaded record holds (its last producer epoch is unknown: -1)."""
        return cls(transactional_id, entry.producer_id, entry.producer_epoch, entry.txn_timeout_ms, entry.state,
                   entry.topic_partitions, entry.txn_start_timestamp, entry.txn_last_update_timestamp,
                   entry.previous_producer_id, entry.next_producer_id, NO_PRODUCER_EPOCH,
                   entry.client_transaction_version)

    def entry(self) -> TxnLogEntry:
        """The current state as an entry (what a record of it would hold)."""
        return TxnLogEntry(self.producer_id, self.producer_epoch, self.txn_timeout_ms, self.state,
                           frozenset(self.topic_partitions), self.txn_start_timestamp,
                           self.txn_last_update_timestamp, self.previous_producer_id, self.next_producer_id,
                           self.last_producer_epoch, self.client_transaction_version)

    def __repr__(self) -> str:
        return (f"TransactionMetadata({self.transactional_id!r}, producer_id={self.producer_id}, "
                f"epoch={self.producer_epoch}, state={self.state.kafka_name}, pending="
                f"{None if self.pending_state is None else self.pending_state.kafka_name}, "
                f"partitions={sorted(self.topic_partitions)})")

    @property
    def is_producer_epoch_exhausted(self) -> bool:
        """True when the current producer id has no epoch left to give (see :func:`is_epoch_exhausted`)."""
        return is_epoch_exhausted(self.producer_epoch)

    @property
    def pending_transition_in_progress(self) -> bool:
        """True while a prepared transition waits for its record (no other may start)."""
        return self.pending_state is not None

    @property
    def has_pending_transaction(self) -> bool:
        """True while a transaction is open: Ongoing, PrepareCommit or PrepareAbort."""
        return self.state in (_S.ONGOING, _S.PREPARE_COMMIT, _S.PREPARE_ABORT)

    # ------------------------------------------------------------------ prepare
    def needs_new_producer_id(self, expected_epoch: int | None = None) -> bool:
        """True when InitProducerId must move to a new producer id: the epoch is exhausted and
        the producer (if it says which epoch it has) has the current one."""
        return self.is_producer_epoch_exhausted and (expected_epoch is None or expected_epoch == self.producer_epoch)

    def prepare_init(self, txn_timeout_ms: int, now_ms: int, expected_epoch: int | None = None,
                     new_producer_id: int = NO_PRODUCER_ID) -> TxnLogEntry:
        """InitProducerId's transition to Empty: the next epoch, or, when the epoch is exhausted
        (:meth:`needs_new_producer_id`), ``new_producer_id`` at epoch 0 (which the caller
        allocated). ``expected_epoch`` is the epoch a producer recovering from an error says
        it has (KIP-360), None for a new producer.

        Raises:
            ProducerFencedError: ``expected_epoch`` is neither the current nor the last epoch.
            ValueError: a new producer id is needed and ``new_producer_id`` is not one.
            IllegalTxnTransitionError: not from Empty, CompleteCommit or CompleteAbort, or a
                transition is pending.
        """
        if self.needs_new_producer_id(expected_epoch):
            if new_producer_id < 0:
                raise ValueError(f"producer epoch {self.producer_epoch} of {self.producer_id} is exhausted: "
                                 "a new producer id is needed")
            return self.prepare_producer_id_rotation(new_producer_id, txn_timeout_ms, now_ms,
                                                     record_last_epoch=expected_epoch is not None)
        return self.prepare_increment_producer_epoch(txn_timeout_ms, expected_epoch, now_ms)

    def prepare_increment_producer_epoch(self, txn_timeout_ms: int, expected_epoch: int | None,
                                         now_ms: int) -> TxnLogEntry:
        """The epoch bump of InitProducerId (Kafka's prepareIncrementProducerEpoch): without an
        expected epoch, the next epoch (the last epoch forgotten); with one equal to the current
        epoch (or no epoch yet), the next epoch remembering the current as last; with one equal
        to the last epoch, a retry of a bump already made: the current epoch again.

        Raises:
            ProducerFencedError: ``expected_epoch`` is neither current nor last.
            IllegalTxnTransitionError: the epoch is exhausted, or the transition is not allowed.
        """
        if self.is_producer_epoch_exhausted:
            raise IllegalTxnTransitionError(f"{self.transactional_id}: no producer epoch left for producer id "
                                            f"{self.producer_id} (epoch {self.producer_epoch})")
        bumped = self.producer_epoch + 1
        if expected_epoch is None:
            epoch, last = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            epoch, last = bumped, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            epoch, last = self.producer_epoch, self.last_producer_epoch
        else:
            raise ProducerFencedError(f"{self.transactional_id}: expected producer epoch {expected_epoch} is neither "
                                      f"the current epoch {self.producer_epoch} nor the last {self.last_producer_epoch}")
        return self._prepare(_S.EMPTY, self.producer_id, epoch, last, txn_timeout_ms, frozenset(), -1, now_ms)

    def prepare_producer_id_rotation(self, new_producer_id: int, txn_timeout_ms: int, now_ms: int,
                                     record_last_epoch: bool) -> TxnLogEntry:
        """InitProducerId's move to ``new_producer_id`` at epoch 0 once the epoch is exhausted
        (the old epoch remembered as last when the producer named it, for its retry).

        Raises:
            IllegalTxnTransitionError: a transaction is open, or the transition is not allowed.
        """
        if self.has_pending_transaction:
            raise IllegalTxnTransitionError(f"{self.transactional_id}: cannot rotate the producer id while a "
                                            f"transaction is {self.state.kafka_name}")
        last = self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH
        return self._prepare(_S.EMPTY, new_producer_id, 0, last, txn_timeout_ms, frozenset(), -1, now_ms)

    def prepare_add_partitions(self, partitions: Iterable[tuple[str, int]], now_ms: int) -> TxnLogEntry:
        """AddPartitionsToTxn (and AddOffsetsToTxn): Ongoing with ``partitions`` added; a
        transaction starting now (from Empty or Complete*) starts at ``now_ms``.

        Raises:
            IllegalTxnTransitionError: not from Empty, Ongoing or Complete*, or a transition is pending.
        """
        start = now_ms if self.state in (_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT) else self.txn_start_timestamp
        return self._prepare(_S.ONGOING, self.producer_id, self.producer_epoch, self.last_producer_epoch,
                             self.txn_timeout_ms, frozenset(self.topic_partitions) | frozenset(partitions), start, now_ms)

    def prepare_abort_or_commit(self, new_state: TransactionState, client_transaction_version: int,
                                next_producer_id: int, now_ms: int) -> TxnLogEntry:
        """EndTxn: PrepareCommit or PrepareAbort of the ongoing transaction. From transaction
        version 2 on (KIP-890) the epoch is bumped too, and ``next_producer_id`` (not -1 when the
        bump exhausts the epoch) is the id the producer moves to at completion.

        Raises:
            IllegalTxnTransitionError: ``new_state`` is not a Prepare state, the transition is not
                allowed, or another is pending.
        """
        if new_state not in _PREPARED:
            raise IllegalTxnTransitionError(f"{self.transactional_id}: EndTxn prepares PrepareCommit or "
                                            f"PrepareAbort, not {TransactionState(new_state).kafka_name}")
        if client_transaction_version >= _EPOCH_BUMP_VERSION:
            epoch, last = self.producer_epoch + 1, self.producer_epoch
        else:
            epoch, last = self.producer_epoch, self.last_producer_epoch
        return self._prepare(new_state, self.producer_id, epoch, last, self.txn_timeout_ms,
                             frozenset(self.topic_partitions), self.txn_start_timestamp, now_ms,
                             next_producer_id, client_transaction_version)

    def prepare_complete(self, now_ms: int) -> TxnLogEntry:
        """The markers are written: CompleteCommit or CompleteAbort, with no partitions left
        (from transaction version 2, at the next producer id with epoch 0 if one was set).

        Raises:
            IllegalTxnTransitionError: not from PrepareCommit or PrepareAbort, or a transition is pending.
        """
        new_state = _S.COMPLETE_COMMIT if self.state == _S.PREPARE_COMMIT else _S.COMPLETE_ABORT
        producer_id, epoch = self.producer_id, self.producer_epoch
        if self.client_transaction_version >= _EPOCH_BUMP_VERSION and self.next_producer_id != NO_PRODUCER_ID:
            producer_id, epoch = self.next_producer_id, 0
        entry = self._prepare(new_state, producer_id, epoch, self.producer_epoch, self.txn_timeout_ms, frozenset(),
                              self.txn_start_timestamp, now_ms, NO_PRODUCER_ID, self.client_transaction_version)
        # The Prepare record is durable: a fence that failed to be written earlier is now moot.
        self.has_failed_epoch_fence = False
        return entry

    def prepare_fence_producer_epoch(self) -> TxnLogEntry:
        """Fence the current producer of an ongoing transaction (it timed out, or a new producer
        initialised): PrepareEpochFence with the epoch bumped, unless an earlier fence's write
        failed (its bump was applied already). Never written itself: :meth:`prepare_fenced_abort`
        follows at once.

        Raises:
            IllegalTxnTransitionError: the epoch is 32767 already, not Ongoing, or a transition is pending.
        """
        if self.producer_epoch >= MAX_PRODUCER_EPOCH:
            raise IllegalTxnTransitionError(f"{self.transactional_id}: cannot fence producer epoch "
                                            f"{self.producer_epoch}: it would overflow")
        epoch = self.producer_epoch if self.has_failed_epoch_fence else self.producer_epoch + 1
        return self._prepare(_S.PREPARE_EPOCH_FENCE, self.producer_id, epoch, NO_PRODUCER_EPOCH, self.txn_timeout_ms,
                             frozenset(self.topic_partitions), self.txn_start_timestamp, self.txn_last_update_timestamp)

    def prepare_fenced_abort(self, fence: TxnLogEntry, now_ms: int) -> TxnLogEntry:
        """The abort that follows :meth:`prepare_fence_producer_epoch`: the fenced epoch takes
        effect in memory now (it is never returned to a producer before it is written) and
        PrepareAbort is prepared with it (Kafka's endTransaction with isEpochFence).

        Raises:
            IllegalTxnTransitionError: the pending state is not PrepareEpochFence.
        """
        if self.pending_state != _S.PREPARE_EPOCH_FENCE or fence.state != _S.PREPARE_EPOCH_FENCE:
            raise IllegalTxnTransitionError(f"{self.transactional_id}: a fenced abort follows PrepareEpochFence, "
                                            f"pending is {self.pending_state!r}")
        self.pending_state = None
        self.producer_epoch = fence.producer_epoch
        self.last_producer_epoch = NO_PRODUCER_EPOCH
        return self.prepare_abort_or_commit(_S.PREPARE_ABORT, 0, NO_PRODUCER_ID, now_ms)

    def prepare_dead(self) -> TxnLogEntry:
        """The transactional id expires: Dead (written as a tombstone).

        Raises:
            IllegalTxnTransitionError: not from Empty or Complete*, or a transition is pending.
        """
        return self._prepare(_S.DEAD, self.producer_id, self.producer_epoch, self.last_producer_epoch,
                             self.txn_timeout_ms, frozenset(), self.txn_start_timestamp, self.txn_last_update_timestamp)

    def _prepare(self, state: TransactionState, producer_id: int, epoch: int, last_epoch: int, timeout_ms: int,
                 partitions: frozenset[tuple[str, int]], start: int, now_ms: int,
                 next_producer_id: int = NO_PRODUCER_ID, client_version: int | None = None) -> TxnLogEntry:
        """Check the transition to ``state`` and record it as pending; the target entry."""
        if self.pending_state is not None:
            raise IllegalTxnTransitionError(f"{self.transactional_id}: transition to {state.kafka_name} while "
                                            f"{self.pending_state.kafka_name} is pending")
        if producer_id < 0:
            raise ValueError(f"illegal new producer id {producer_id}")
        # The epoch is -1 only for an id just created, which may stay so until it expires.
        if state != _S.DEAD and epoch < 0:
            raise ValueError(f"illegal new producer epoch {epoch}")
        if self.state not in VALID_PREVIOUS_STATES[state]:
            raise IllegalTxnTransitionError(f"{self.transactional_id}: {state.kafka_name} cannot follow "
                                            f"{self.state.kafka_name}")
        version = self.client_transaction_version if client_version is None else client_version
        entry = TxnLogEntry(producer_id, epoch, timeout_ms, state, partitions, start, now_ms, self.producer_id,
                            next_producer_id, last_epoch, version)
        self.pending_state = state
        return entry

    # ------------------------------------------------------------------ complete
    def clear_pending(self, failed_epoch_fence: bool = False) -> None:
        """Give up the pending transition: its record was not written. ``failed_epoch_fence``:
        the transition was a fenced abort, whose epoch bump stays in memory, so the next fence
        must not bump again (Kafka's hasFailedEpochFence)."""
        self.pending_state = None
        if failed_epoch_fence:
            self.has_failed_epoch_fence = True

    def remove_partition(self, topic_partition: tuple[str, int]) -> None:
        """A partition's marker is written: it no longer waits for one.

        Raises:
            IllegalTxnTransitionError: not in PrepareCommit or PrepareAbort.
        """
        if self.state not in _PREPARED:
            raise IllegalTxnTransitionError(f"{self.transactional_id}: markers are written in PrepareCommit or "
                                            f"PrepareAbort, not {self.state.kafka_name}")
        self.topic_partitions.discard(topic_partition)

    def complete_transition(self, entry: TxnLogEntry) -> None:
        """Apply ``entry``, the pending transition, once its record is durable (Kafka's
        completeTransitionTo). Valid iff the entry's state is the pending one and: to Empty, the
        epoch is the same, one more, or 0 of a new producer id, with no partitions and no start;
        to Ongoing, the same producer and epoch, the same timeout and no partition dropped; to a
        Prepare state, the same producer, epoch (before a KIP-890 bump), timeout, partitions and
        start; to a Complete state, the same producer and epoch (before a KIP-890 move to the next
        id), timeout and a start.

        Raises:
            IllegalTxnTransitionError: no pending transition, or the entry breaks those rules
                (Dead and PrepareEpochFence are never completed: an expired id is removed, a
                fence becomes a PrepareAbort).
        """
        to = self.pending_state
        if to is None or to != entry.state:
            raise IllegalTxnTransitionError(f"{self.transactional_id}: completing {entry} while "
                                            f"{'nothing' if to is None else to.kafka_name} is pending")
        bumps = entry.client_transaction_version >= _EPOCH_BUMP_VERSION
        if to == _S.EMPTY:
            if ((self.producer_epoch != entry.producer_epoch and not self._valid_epoch_bump(entry))
                    or entry.topic_partitions or entry.txn_start_timestamp != -1):
                raise self._transition_failure(entry)
            self.txn_timeout_ms = entry.txn_timeout_ms
            self.producer_epoch = entry.producer_epoch
            self.last_producer_epoch = entry.last_producer_epoch
            self.producer_id = entry.producer_id
            self.previous_producer_id = entry.previous_producer_id
        elif to == _S.ONGOING:
            if (not self._valid_producer_epoch(entry) or not self.topic_partitions <= entry.topic_partitions
                    or self.txn_timeout_ms != entry.txn_timeout_ms):
                raise self._transition_failure(entry)
            self.txn_start_timestamp = entry.txn_start_timestamp
            self.topic_partitions |= entry.topic_partitions
        elif to in _PREPARED:
            if (not self._valid_producer_epoch(entry) or self.topic_partitions != entry.topic_partitions
                    or self.txn_timeout_ms != entry.txn_timeout_ms
                    or self.txn_start_timestamp != entry.txn_start_timestamp):
                raise self._transition_failure(entry)
            if bumps:
                self.producer_epoch = entry.producer_epoch
                self.last_producer_epoch = entry.last_producer_epoch
                self.next_producer_id = entry.next_producer_id
        elif to in _COMPLETED:
            if (not self._valid_producer_epoch(entry) or self.txn_timeout_ms != entry.txn_timeout_ms
                    or entry.txn_start_timestamp == -1):
                raise self._transition_failure(entry)
            self.txn_start_timestamp = entry.txn_start_timestamp
            self.topic_partitions.clear()
            if bumps:
                self.producer_epoch = entry.producer_epoch
                self.last_producer_epoch = entry.last_producer_epoch
                self.previous_producer_id = entry.previous_producer_id
                self.producer_id = entry.producer_id
                self.next_producer_id = entry.next_producer_id
        else:  # Dead and PrepareEpochFence are never completed
            raise self._transition_failure(entry)
        self.client_transaction_version = entry.client_transaction_version
        self.txn_last_update_timestamp = entry.txn_last_update_timestamp
        self.pending_state = None
        self.state = to

    def _valid_producer_epoch(self, entry: TxnLogEntry) -> bool:
        """The entry keeps this producer and epoch, allowing for KIP-890's bump at Prepare (the
        entry's last epoch is ours) and its move to the next id at Complete (its previous id and
        last epoch are ours)."""
        bumps = entry.client_transaction_version >= _EPOCH_BUMP_VERSION
        overflow = bumps and entry.state in _COMPLETED and entry.producer_epoch == 0
        epoch = entry.last_producer_epoch if overflow or (bumps and entry.state in _PREPARED) else entry.producer_epoch
        producer_id = entry.previous_producer_id if overflow else entry.producer_id
        return epoch == self.producer_epoch and producer_id == self.producer_id

    def _valid_epoch_bump(self, entry: TxnLogEntry) -> bool:
        return entry.producer_epoch == self.producer_epoch + 1 or (
            entry.producer_epoch == 0 and entry.producer_id != self.producer_id)

    def _transition_failure(self, entry: TxnLogEntry) -> IllegalTxnTransitionError:
        return IllegalTxnTransitionError(f"{self!r}: the transition to {entry} breaks the state machine's rules")
