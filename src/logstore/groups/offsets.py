"""Committed consumer-group offsets, kept in the internal compacted topic ``__consumer_offsets``.

A commit is one record per partition, in Kafka's own schema (kafka.coordinator.group's
GroupMetadataManager), so Kafka tooling that reads that topic understands our records:

* key, version 1 (offset commit): ``int16 version=1, string group, string topic, int32 partition``
* value, version 3: ``int16 version=3, int64 offset, int32 leader_epoch, string metadata,
  int64 commit_timestamp`` (the leader epoch the consumer last saw for the partition, KIP-320;
  -1 when the client gave none)
* a null value (tombstone) removes the group's offset for that partition.

Strings are ``int16 length`` + UTF-8 bytes, integers big-endian. Every record of one commit goes
into one batch, and a batch is written whole or not at all (its CRC covers it), so a commit
interrupted by a crash leaves every partition's previous offset or every new one, never a mix
and never garbage. The topic is compacted: only the latest commit per key survives cleaning.

Reading: :class:`OffsetStore` replays the topic once and then follows it (commits made by other
processes included), so ``committed()`` is a dictionary lookup after catching up.

Transactional commits (Kafka's TxnOffsetCommit, KIP-98): a producer's offsets are written as a
transactional batch with its producer id and epoch; they stay pending, invisible to
``committed()``, until the producer's COMMIT marker reaches the topic, and are dropped at its
ABORT marker, as Kafka's group coordinator applies them (at the marker, after any plain commit
written meanwhile).

Thread-safety: OffsetStore is thread-safe.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
import weakref
from typing import Any, Iterable, Mapping

from .._native import lib
from ..errors import CorruptRecordError, OffsetOutOfRangeError
from ..records.batch import Record, RecordDecoder, batch_headers
from ..records.control import ControlType, read_marker
from .consumerrecords import CONSUMER_KEY_VERSIONS
from .metadata import GroupMetadata, decode_group_key, decode_group_value, encode_group_key, encode_group_value

__all__ = ["OffsetStore", "OffsetsReplay", "OFFSETS_TOPIC", "encode_offset_key", "encode_offset_value", "decode_offset_key", "decode_offset_value",
           "offset_value_leader_epoch", "OFFSETS_TOPIC_CONFIG", "offset_store"]

#: Kafka's internal topic of committed consumer offsets.
OFFSETS_TOPIC = "__consumer_offsets"
KEY_VERSION = 1
VALUE_VERSION = 3
_I16 = struct.Struct(">h")
_VALUE_HEAD = struct.Struct(">hqi")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
logger = logging.getLogger("logstore.groups.offsets")
#: bytes of the topic read at a time while catching up
_CHUNK_BYTES = 1 << 20
_TRANSACTIONAL = lib.LS_ATTR_TRANSACTIONAL
_CONTROL = lib.LS_ATTR_CONTROL

#: Settings of the offsets topic (Kafka's offsets.topic.* defaults).
OFFSETS_TOPIC_CONFIG = dict(cleanup_policy="compact", segment_bytes=100 * 1024 * 1024,
                            min_cleanable_dirty_ratio=0.5)


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > 32767:
        raise ValueError(f"string of {len(raw)} bytes does not fit Kafka's int16 length")
    return _I16.pack(len(raw)) + raw


def _read_string(buf: bytes, pos: int, what: str) -> tuple[str, int]:
    if pos + 2 > len(buf):
        raise CorruptRecordError(None, None, f"offset commit {what}: truncated string length")
    (n,) = _I16.unpack_from(buf, pos)
    pos += 2
    if n < 0 or pos + n > len(buf):
        raise CorruptRecordError(None, None, f"offset commit {what}: string length {n} out of range")
    try:
        return buf[pos:pos + n].decode("utf-8"), pos + n
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(None, None, f"offset commit {what}: {exc}") from None


def encode_offset_key(group: str, topic: str, partition: int) -> bytes:
    """The ``__consumer_offsets`` key of a group's commit for one partition (Kafka's version 1)."""
    return _I16.pack(KEY_VERSION) + _string(group) + _string(topic) + _I32.pack(partition)


def decode_offset_key(key: bytes) -> tuple[str, str, int] | None:
    """(group, topic, partition) of an offset-commit key; None for Kafka's other key versions
    (group metadata, version 2: :mod:`logstore.groups.metadata`)."""
    if len(key) < 2:
        raise CorruptRecordError(None, None, "offset commit key shorter than its version")
    (version,) = _I16.unpack_from(key, 0)
    if version not in (0, 1):
        return None
    group, pos = _read_string(key, 2, "key group")
    topic, pos = _read_string(key, pos, "key topic")
    if pos + 4 != len(key):
        raise CorruptRecordError(None, None, "offset commit key has a bad length")
    return group, topic, _I32.unpack_from(key, pos)[0]


def encode_offset_value(offset: int, metadata: str = "", commit_timestamp: int | None = None,
                        leader_epoch: int = -1) -> bytes:
    """The ``__consumer_offsets`` value of a commit (Kafka's version 3); commit time now by default."""
    ts = int(time.time() * 1000) if commit_timestamp is None else commit_timestamp
    return _VALUE_HEAD.pack(VALUE_VERSION, offset, leader_epoch) + _string(metadata) + _I64.pack(ts)


def decode_offset_value(value: bytes) -> tuple[int, str, int]:
    """(offset, metadata, commit timestamp) of a value of version 1 or 3."""
    if len(value) < 2:
        raise CorruptRecordError(None, None, "offset commit value shorter than its version")
    (version,) = _I16.unpack_from(value, 0)
    if version == 3:
        if len(value) < 14:
            raise CorruptRecordError(None, None, "offset commit value truncated")
        _, offset, _ = _VALUE_HEAD.unpack_from(value, 0)
        metadata, pos = _read_string(value, 14, "value metadata")
    elif version in (0, 1):
        if len(value) < 10:
            raise CorruptRecordError(None, None, "offset commit value truncated")
        (offset,) = _I64.unpack_from(value, 2)
        metadata, pos = _read_string(value, 10, "value metadata")
    else:
        raise CorruptRecordError(None, None, f"offset commit value version {version} is not supported")
    if pos + 8 > len(value):
        raise CorruptRecordError(None, None, "offset commit value lacks its timestamp")
    return offset, metadata, _I64.unpack_from(value, pos)[0]


def offset_value_leader_epoch(value: bytes) -> int:
    """The committed leader epoch of a value :func:`decode_offset_value` accepts: version 3
    carries it, earlier versions have none (-1)."""
    if len(value) >= 14 and _I16.unpack_from(value, 0)[0] == 3:
        return _VALUE_HEAD.unpack_from(value, 0)[2]  # type: ignore[no-any-return]
    return -1


class OffsetsReplay:
    """What the batches of ``__consumer_offsets`` say, applied in order (the one reader of the
    topic's batches: :class:`OffsetStore` follows the live log with it, ``logstore stats`` reads
    a store's files with it): each group's committed offsets and membership, and each producer's
    transactional commits, held until its marker (see the module docstring). Not thread-safe
    (its owner serialises ``feed``)."""

    def __init__(self) -> None:
        #: (group, topic, partition) -> (offset, metadata) of every committed offset
        self.offsets: dict[tuple[str, str, int], tuple[int, str]] = {}
        #: (group, topic, partition) -> the leader epoch committed with the offset, where one was
        #: (an entry of ``offsets`` missing here has none: -1)
        self.leader_epochs: dict[tuple[str, str, int], int] = {}
        #: group -> its last stored membership
        self.groups: dict[str, GroupMetadata] = {}
        #: key -> value of the last record of each of Kafka's consumer group records (KIP-848,
        #: :mod:`~logstore.groups.consumerrecords`), read by the consumer group coordinator
        self.consumer_records: dict[bytes, bytes] = {}
        #: producer id -> the offset records of its open transaction, in log order
        self.pending: dict[int, list[Record]] = {}
        self._decoder = RecordDecoder()

    def feed(self, data: Any, min_offset: int, end: int) -> int:
        """Apply the whole batches in ``data`` (as ``read_raw`` returns them, or a segment's
        valid bytes) that end at or after ``min_offset`` and start below ``end``: runs of plain
        batches decoded at once, a transaction's batches held until its marker. Returns the
        offset after the last batch applied (``min_offset`` when none was).

        Raises:
            CorruptRecordError: a batch or a marker cannot be read.
        """
        position_offset = min_offset
        run = None  # (first, end) bytes of consecutive plain batches
        for position, header in batch_headers(data):
            if header.base_offset >= end:
                break
            if header.last_offset < min_offset:
                continue
            if header.producer_id >= 0 and header.attributes & (_TRANSACTIONAL | _CONTROL):
                if run is not None:
                    self._apply(self._decode(data, run[0], run[1], min_offset))
                    run = None
                self._take_transactional(data, position, header, min_offset)
            elif not header.attributes & _CONTROL:
                run = (position, position + header.size) if run is None else (run[0], position + header.size)
            position_offset = max(position_offset, header.last_offset + 1)
        if run is not None:
            self._apply(self._decode(data, run[0], run[1], min_offset))
        return position_offset

    def _decode(self, data: Any, first: int, stop: int, min_offset: int) -> list[Record]:
        return self._decoder.decode(data, first, stop, min_offset, -1, None, OFFSETS_TOPIC)[0]

    def _take_transactional(self, data: Any, position: int, header: Any, min_offset: int) -> None:
        """A producer's transactional batch (held until its marker) or its marker: a COMMIT
        applies the held records, an ABORT drops them."""
        pid = header.producer_id
        if header.attributes & _CONTROL:
            if not header.attributes & _TRANSACTIONAL:
                return
            kind, _ = read_marker(data, position, header.size, OFFSETS_TOPIC)
            held = self.pending.pop(pid, [])
            if kind == ControlType.COMMIT:
                self._apply(held)
            return
        if header.attributes & _TRANSACTIONAL:
            self.pending.setdefault(pid, []).extend(self._decode(data, position, position + header.size, min_offset))
        else:
            self._apply(self._decode(data, position, position + header.size, min_offset))

    def _apply(self, records: list[Record]) -> None:
        for r in records:
            if r.key is None:
                continue
            parsed = decode_offset_key(r.key)
            if parsed is None:
                self._take_group(r.key, r.value, r.offset)
                continue
            if r.value is None:
                self.offsets.pop(parsed, None)
                self.leader_epochs.pop(parsed, None)
            else:
                offset, metadata, _ = decode_offset_value(r.value)
                self.offsets[parsed] = (offset, metadata)
                epoch = offset_value_leader_epoch(r.value)
                if epoch >= 0:
                    self.leader_epochs[parsed] = epoch
                else:
                    self.leader_epochs.pop(parsed, None)

    def _take_group(self, key: bytes, value: bytes | None, offset: int) -> None:
        if len(key) >= 2 and _I16.unpack_from(key, 0)[0] in CONSUMER_KEY_VERSIONS:
            if value is None:
                self.consumer_records.pop(bytes(key), None)
            else:
                self.consumer_records[bytes(key)] = bytes(value)
            return
        try:
            group = decode_group_key(key)
            if group is None:
                return
            if value is None:
                self.groups.pop(group, None)
                return
            metadata = decode_group_value(value)
        except CorruptRecordError as exc:  # membership only: its members join again
            logger.warning("skipping the group metadata record at offset %d of %s: %s", offset, OFFSETS_TOPIC, exc)
            return
        if metadata is not None:
            self.groups[group] = metadata


class OffsetStore:
    """Committed offsets of every group, backed by one partition of ``__consumer_offsets``.

    Durability: :meth:`commit` returns after the commit batch is fsynced (unless durable=False:
    then in the page cache, which survives a crash of the process but not of the machine).
    """

    def __init__(self, log: object) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._replay = OffsetsReplay()
        self._offsets = self._replay.offsets
        self._groups = self._replay.groups
        self._position = 0

    def _catch_up(self) -> None:
        """Apply what the topic holds past what was read (held: the lock)."""
        log = self._log
        end = log.log_end_offset  # type: ignore[attr-defined]
        while self._position < end:
            start = self._position
            try:
                data = log.read_raw(start, _CHUNK_BYTES)  # type: ignore[attr-defined]
            except OffsetOutOfRangeError as exc:
                # Retention or compaction moved the start past us: everything live is after it.
                self._position = exc.log_start_offset
                continue
            if not data:
                self._position = end
                break
            self._position = self._replay.feed(data, start, end)
            if self._position == start:  # pragma: no cover - read_raw returns batches past start
                break

    def commit(self, group: str, offsets: Mapping[Any, int | tuple[int, str] | tuple[int, str, int]],
               durable: bool = True) -> None:
        """Commit ``{(topic, partition): offset, (offset, metadata) or (offset, metadata,
        leader epoch)}`` for ``group`` atomically (the leader epoch -1 when not given)."""
        if not offsets:
            return
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        now = int(time.time() * 1000)
        for (topic, partition), item in offsets.items():
            offset, metadata, epoch = _commit_item(item)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"offset for {topic}-{partition} must be an int >= 0, got {offset!r}")
            keys.append(encode_offset_key(group, topic, partition))
            values.append(encode_offset_value(offset, metadata, now, epoch))
        with self._lock:
            self._log.append_batch(values, keys)  # type: ignore[attr-defined]
        if durable:
            self._log.flush()  # type: ignore[attr-defined]
        with self._lock:
            self._catch_up()

    def commit_transactional(self, group: str, offsets: Mapping[Any, int | tuple[int, str] | tuple[int, str, int]],
                             producer_id: int,
                             producer_epoch: int) -> None:
        """Write ``{(topic, partition): offset or (offset, metadata)}`` of ``group`` as part of
        the producer's transaction (Kafka's TxnOffsetCommit): pending until the producer's
        COMMIT marker reaches the topic (:meth:`committed` shows them from then on), dropped at
        its ABORT marker. One batch: all of them or none.

        Durability: fsynced on return. Thread-safe."""
        if not offsets:
            return
        now = int(time.time() * 1000)
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        for (topic, partition), item in offsets.items():
            offset, metadata, epoch = _commit_item(item)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"offset for {topic}-{partition} must be an int >= 0, got {offset!r}")
            keys.append(encode_offset_key(group, topic, partition))
            values.append(encode_offset_value(offset, metadata, now, epoch))
        with self._lock:
            self._log.append_batch(values, keys, producer_id=producer_id,  # type: ignore[attr-defined]
                                   producer_epoch=producer_epoch, transactional=True)
        self._log.flush()  # type: ignore[attr-defined]
        with self._lock:
            self._catch_up()

    def pending(self, group: str) -> set[tuple[str, int]]:
        """The partitions with a transactional commit of ``group`` waiting for its marker
        (Kafka's OffsetFetch answers UNSTABLE_OFFSET_COMMIT for them when asked to)."""
        with self._lock:
            self._catch_up()
            out = set()
            for records in self._replay.pending.values():
                for r in records:
                    parsed = decode_offset_key(r.key) if r.key is not None else None
                    if parsed is not None and parsed[0] == group:
                        out.add((parsed[1], parsed[2]))
            return out

    def sync(self) -> None:
        """Make what this thread appended durable, as :meth:`commit` with ``durable`` does
        (after ``durable=False`` commits)."""
        self._log.flush()  # type: ignore[attr-defined]

    def store_group(self, group: str, metadata: GroupMetadata | None, durable: bool = True) -> None:
        """Write ``group``'s membership (None: a tombstone, the group is gone).

        Durability: fsynced on return unless ``durable`` is False.
        """
        key = encode_group_key(group)
        value = None if metadata is None else encode_group_value(metadata)
        with self._lock:
            self._log.append_batch([value], [key])  # type: ignore[attr-defined]
        if durable:
            self._log.flush()  # type: ignore[attr-defined]
        with self._lock:
            self._catch_up()

    def append_records(self, records: Iterable[tuple[bytes, bytes | None]], durable: bool = True) -> None:
        """Write ``(key, value)`` records (a None value: a tombstone) in one batch: all or none
        (the consumer group records of :mod:`~logstore.groups.consumerrecords`).

        Durability: fsynced (or held by a majority) on return unless ``durable`` is False.
        Thread-safe."""
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        for key, value in records:
            keys.append(key)
            values.append(value)
        if not keys:
            return
        with self._lock:
            self._log.append_batch(values, keys)  # type: ignore[attr-defined]
        if durable:
            self._log.flush()  # type: ignore[attr-defined]
        with self._lock:
            self._catch_up()

    def consumer_group_records(self) -> dict[bytes, bytes]:
        """The last value of every live consumer group record, by key. Thread-safe."""
        with self._lock:
            self._catch_up()
            return dict(self._replay.consumer_records)

    def group_metadata(self) -> dict[str, GroupMetadata]:
        """Every group's last stored membership (:mod:`logstore.groups.metadata`)."""
        with self._lock:
            self._catch_up()
            return dict(self._groups)

    def delete(self, group: str, partitions: Iterable[tuple[str, int]], durable: bool = False) -> None:
        """Remove the group's committed offsets for ``partitions`` (tombstones, one batch).

        Durability: fsynced on return when ``durable`` (else in the page cache)."""
        keys: list[bytes | None] = [encode_offset_key(group, t, p) for t, p in partitions]
        if keys:
            with self._lock:
                self._log.append_batch([None] * len(keys), keys)  # type: ignore[attr-defined]
            if durable:
                self._log.flush()  # type: ignore[attr-defined]
            with self._lock:
                self._catch_up()

    def delete_group(self, group: str, records: Iterable[bytes] = ()) -> None:
        """Remove ``group`` whole (Kafka's DeleteGroups): a tombstone for each of its committed
        offsets, one for its membership and one for each key of ``records`` (a consumer
        group's records), in one batch, so that a crash leaves the group whole or gone.
        Transactional commits still waiting for their marker are not touched.

        Durability: fsynced on return. Thread-safe."""
        with self._lock:
            self._catch_up()
            keys: list[bytes | None] = [encode_offset_key(group, t, p)
                                        for (g, t, p) in self._offsets if g == group]
            keys.append(encode_group_key(group))
            keys.extend(records)
            self._log.append_batch([None] * len(keys), keys)  # type: ignore[attr-defined]
        self._log.flush()  # type: ignore[attr-defined]
        with self._lock:
            self._catch_up()

    def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's last committed offset for the partition, or None."""
        with self._lock:
            self._catch_up()
            found = self._offsets.get((group, topic, partition))
        return None if found is None else found[0]

    def committed_with_metadata(self, group: str, topic: str, partition: int) -> tuple[int, str] | None:
        """The group's last committed (offset, metadata) for the partition, or None."""
        with self._lock:
            self._catch_up()
            return self._offsets.get((group, topic, partition))

    def committed_entry(self, group: str, topic: str, partition: int) -> tuple[int, str, int] | None:
        """The group's last committed (offset, metadata, leader epoch) for the partition, or None
        (the leader epoch -1 when the commit gave none)."""
        with self._lock:
            self._catch_up()
            found = self._offsets.get((group, topic, partition))
            if found is None:
                return None
            return found[0], found[1], self._replay.leader_epochs.get((group, topic, partition), -1)

    def group_entries(self, group: str) -> dict[tuple[str, int], tuple[int, str, int]]:
        """The group's committed ``{(topic, partition): (offset, metadata, leader epoch)}``."""
        with self._lock:
            self._catch_up()
            epochs = self._replay.leader_epochs
            return {(t, p): (found[0], found[1], epochs.get((g, t, p), -1))
                    for (g, t, p), found in self._offsets.items() if g == group}

    def group_offsets(self, group: str) -> dict[tuple[str, int], tuple[int, str]]:
        """The group's committed ``{(topic, partition): (offset, metadata)}``."""
        with self._lock:
            self._catch_up()
            return {(t, p): found for (g, t, p), found in self._offsets.items() if g == group}

    def groups(self) -> dict[str, dict[tuple[str, int], int]]:
        """Every group's committed offsets."""
        with self._lock:
            self._catch_up()
            out: dict[str, dict[tuple[str, int], int]] = {}
            for (group, topic, partition), (offset, _) in self._offsets.items():
                out.setdefault(group, {})[(topic, partition)] = offset
            return out


def _commit_item(item: Any) -> tuple[Any, str, int]:
    """(offset, metadata, leader epoch) of a commit's item: an offset, (offset, metadata) or
    (offset, metadata, leader epoch)."""
    if not isinstance(item, tuple):
        return item, "", -1
    if len(item) == 2:
        return item[0], item[1], -1
    return item[0], item[1], item[2]


_OFFSET_STORES: "weakref.WeakKeyDictionary[Any, OffsetStore]" = weakref.WeakKeyDictionary()
_OFFSET_STORES_LOCK = threading.Lock()


def offset_store(store: Any) -> OffsetStore:
    """The store's one OffsetStore over ``__consumer_offsets`` partition 0, shared by its
    consumers, its Kafka listener and the mirror (the topic is created on first use).

    Thread-safety: thread-safe.
    """
    with _OFFSET_STORES_LOCK:
        found = _OFFSET_STORES.get(store)
        if found is None:
            store.create_topic(OFFSETS_TOPIC, 1, exist_ok=True, internal=True, **OFFSETS_TOPIC_CONFIG)
            found = _OFFSET_STORES[store] = OffsetStore(store.partition(OFFSETS_TOPIC, 0))
        return found
