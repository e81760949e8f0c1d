"""Records and batches: Kafka's RecordBatch v2 built and decoded through the C core.

:class:`Record` is what reads return. :class:`BatchBuilder` turns Python sequences into one
encoded batch with a single C call (plus a codec call when compressed); :class:`RecordDecoder`
turns a byte range of consecutive batches into Records with a single C call per run of
uncompressed batches (plus one per compressed batch).

Both classes keep scratch buffers and are therefore not thread-safe: each Log owns its own and
uses them under its lock; :func:`decode_batches` is a thread-safe convenience for one-off use.
"""

from __future__ import annotations

import struct
import time
from array import array
from itertools import repeat
from enum import IntEnum
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

from . import compression
from .._native import check, ffi, lib, reason
from .._native._records import build as build_records
from .._native._records import column as _c_column
from ..errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError, UnsupportedCodecError

__all__ = [
    "Record",
    "TimestampType",
    "BatchHeader",
    "BatchBuilder",
    "RecordDecoder",
    "ArrowColumns",
    "MAX_DECOMPRESSED_BYTES",
    "decode_batches",
    "decode_headers",
    "entry_extent",
    "ENTRY_HEAD_SIZE",
    "now_ms",
]

HEADER_SIZE: int = lib.LS_BATCH_HEADER_SIZE
LOG_OVERHEAD: int = lib.LS_LOG_OVERHEAD


class TimestampType(IntEnum):
    """Kafka's timestamp types: the batch attribute bit 3."""

    CREATE_TIME = lib.LS_TIMESTAMP_CREATE_TIME
    LOG_APPEND_TIME = lib.LS_TIMESTAMP_LOG_APPEND_TIME


#: the timestamp type of a batch by its attribute bit (0: CreateTime, 1: LogAppendTime)
TIMESTAMP_TYPES = (TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME)

#: The largest records section a compressed batch may inflate to (a decompression-bomb guard): the
#: default bound of :class:`RecordDecoder`. The Spark JVM reader has the same number in its own home
#: (``spark/jvm/RangeReader.java``, ``MAX_DECOMPRESSED``); tests/spark/test_spark_jvm.py checks the pair.
MAX_DECOMPRESSED_BYTES = 256 << 20


class Record(NamedTuple):
    """One record read from a log. Immutable; safe to share between threads.

    Attributes:
        offset: the record's logical offset in its partition.
        timestamp: milliseconds since the epoch (CreateTime, or LogAppendTime when the log
            stamps records on append).
        timestamp_type: :class:`TimestampType`.
        key: bytes, or None for a record without key.
        value: bytes, or None for a tombstone.
        headers: list of ``(str, bytes | None)`` pairs, in order.
    """

    offset: int
    timestamp: int
    timestamp_type: TimestampType
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


class BatchHeader(NamedTuple):
    """The decoded 61-byte header of one batch: what :func:`parse_header`, :func:`batch_headers`
    and :func:`validate_batch` return. Immutable; safe to share between threads."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def last_offset(self) -> int:
        """Offset of the batch's last record."""
        return self.base_offset + self.last_offset_delta

    @property
    def size(self) -> int:
        """The batch's size in bytes, header included."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def compression(self) -> int:
        """The compression codec id (attributes bits 0-2)."""
        return self.attributes & lib.LS_ATTR_COMPRESSION_MASK

    @property
    def timestamp_type(self) -> TimestampType:
        """CreateTime or LogAppendTime (attributes bit 3)."""
        return TIMESTAMP_TYPES[1 if self.attributes & lib.LS_ATTR_TIMESTAMP_TYPE else 0]

    @classmethod
    def from_c(cls, h: Any) -> "BatchHeader":
        """Copy a C ``ls_batch_header`` into a BatchHeader."""
        return cls(
            h.base_offset, h.batch_length, h.partition_leader_epoch, h.magic, h.crc,
            h.attributes, h.last_offset_delta, h.base_timestamp, h.max_timestamp,
            h.producer_id, h.producer_epoch, h.base_sequence, h.records_count,
        )


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch, as Kafka timestamps are."""
    return time.time_ns() // 1_000_000




# ====================================================================== encoding
def _column(items: Sequence[Any], what: str, nullable: bool) -> tuple[bytes, Any]:
    """Concatenate byte strings and their lengths (-1 for None, int32 native order) for the C
    encoder.

    A list or tuple of bytes (and None) is walked once in C (``_records.column``): for 1000
    items that takes a few microseconds, where b"".join and struct.pack(*map(len, items)) took
    70 us, the larger part of a whole batch append. Other sequences and items take the general
    path, which names what is wrong.
    """
    got = _c_column(items, nullable)
    if got is not None:
        return got
    try:
        data = b"".join(items)
        lens = struct.pack(f"={len(items)}i", *map(len, items))
        return data, lens
    except TypeError:
        pass
    parts = []
    slow_lens = array("i")
    for i, item in enumerate(items):
        if item is None:
            if not nullable:
                raise TypeError(f"{what}[{i}] is None, which is not allowed here")
            slow_lens.append(-1)
        elif isinstance(item, (bytes, bytearray, memoryview)):
            b = bytes(item)
            parts.append(b)
            slow_lens.append(len(b))
        else:
            raise TypeError(f"{what}[{i}] must be bytes or None, got {type(item).__name__}")
    return b"".join(parts), slow_lens


def _header_pairs(headers: Iterable[tuple[str, bytes | None]], what: str) -> Iterable[tuple[bytes, Any]]:
    """Yield (utf-8 key, value) for one record's headers, checking their types."""
    for pair in headers:
        try:
            name, value = pair
        except (TypeError, ValueError):
            raise TypeError(f"{what} must hold (str, bytes | None) pairs, got {pair!r}") from None
        if not isinstance(name, str):
            raise TypeError(f"{what}: header key must be str, got {type(name).__name__}")
        if value is not None and not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"{what}: header value must be bytes or None, got {type(value).__name__}")
        yield name.encode("utf-8"), value


def decode_headers(buf: Any, position: int, length: int, count: int) -> list[tuple[str, bytes | None]]:
    """The ``count`` headers of one record, encoded in ``buf[position:position + length]``, as
    (name, value) pairs (a header's value may be None); :func:`encode_headers` in reverse.

    Raises:
        CorruptRecordError: the bytes are not ``count`` well-formed headers.
    """
    raw = bytes(buf[position : position + length])
    kp = ffi.new("int32_t[]", count)
    kl = ffi.new("int32_t[]", count)
    vp = ffi.new("int32_t[]", count)
    vl = ffi.new("int32_t[]", count)
    check(lib.ls_headers_decode(raw, len(raw), count, kp, kl, vp, vl))
    out = []
    for i in range(count):
        name = raw[kp[i] : kp[i] + kl[i]].decode("utf-8", errors="replace")
        out.append((name, raw[vp[i] : vp[i] + vl[i]] if vl[i] >= 0 else None))
    return out


def encode_headers(headers: Iterable[tuple[str, bytes | None]], what: str = "headers") -> tuple[bytes, int]:
    """Encode one record's headers (count excluded) for the single-append path."""
    out = bytearray()
    count = 0
    scratch = ffi.new("char[10]")
    for key, value in _header_pairs(headers, what):
        out += ffi.buffer(scratch, lib.ls_varint_encode(len(key), scratch))
        out += key
        if value is None:
            out += ffi.buffer(scratch, lib.ls_varint_encode(-1, scratch))
        else:
            out += ffi.buffer(scratch, lib.ls_varint_encode(len(value), scratch))
            out += value
        count += 1
    return bytes(out), count


class BatchBuilder:
    """Builds one RecordBatch v2 from columns of Python values. Not thread-safe (scratch space).

    The whole batch is encoded by one C call (``ls_batch_encode``); a compressed batch takes one
    call to encode the records section, one codec call, and one call to write the header and CRC.
    """

    def __init__(self) -> None:
        self._in = ffi.new("ls_records_in *")
        self._hdr = ffi.new("ls_batch_header *")
        self._scratch = bytearray(1 << 16)
        #: max timestamp of the last batch built (LogAppendTime: the append time)
        self.last_max_timestamp = -1

    def build(
        self,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Iterable[tuple[str, bytes | None]] | None] | None = None,
        timestamps: Sequence[int] | None = None,
        *,
        codec: int = compression.NONE,
        level: int | None = None,
        timestamp_type: int = 0,
        base_offset: int = 0,
        partition_leader_epoch: int = -1,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
        log_append_time: int | None = None,
        offset_deltas: Sequence[int] | None = None,
        last_offset_delta: int | None = None,
        delete_horizon: int | None = None,
        control: bool = False,
        transactional: bool = False,
        copy: bool = True,
    ) -> bytes | bytearray | memoryview:
        """Return the encoded batch. Argument errors raise TypeError/ValueError, nothing else.

        ``offset_deltas`` (strictly increasing, >= 0) keeps the original offsets of records that
        are rewritten (truncation of a batch, compaction); by default record i gets delta i.
        ``last_offset_delta`` keeps a rewritten batch's offset span when its last records are
        gone (Kafka keeps the span so that the log end offset does not move back).
        ``log_append_time`` stamps the batch as LogAppendTime with that max timestamp.
        ``delete_horizon`` marks a cleaned batch (KIP-534): attribute bit 6, and the horizon
        becomes the base timestamp that record timestamp deltas are relative to.
        ``control`` marks a control batch (attribute bit 5): its records are metadata (see
        :func:`~logstore.records.control.leader_change_record`) that reads pass over.
        ``transactional`` marks the batch as part of a transaction (attribute bit 4): its
        producer's transaction marker later commits or aborts it.
        With ``copy=False`` the result may be a writable view of the builder's scratch space,
        valid only until the next call (the append path uses it to avoid a copy).
        """
        n = len(values)
        if n == 0:
            raise ValueError("a batch needs at least one record")
        if n > 2**31 - 1:
            raise ValueError("too many records for one batch")
        keep: list[Any] = []  # Python references for every buffer handed to C, alive for the whole call
        rin = self._in
        rin.count = n
        vdata, vlens = _column(values, "values", True)
        keep += (vdata, vlens)
        rin.values = ffi.from_buffer(vdata)
        rin.value_lens = ffi.from_buffer("int32_t[]", vlens)
        if keys is None:
            rin.keys = ffi.NULL
            rin.key_lens = ffi.NULL
        else:
            if len(keys) != n:
                raise ValueError(f"keys has {len(keys)} items but values has {n}")
            kdata, klens = _column(keys, "keys", True)
            keep += (kdata, klens)
            rin.keys = ffi.from_buffer(kdata)
            rin.key_lens = ffi.from_buffer("int32_t[]", klens)
        if offset_deltas is None:
            rin.offset_deltas = ffi.NULL
            last_delta = n - 1
        else:
            if len(offset_deltas) != n:
                raise ValueError(f"offset_deltas has {len(offset_deltas)} items but values has {n}")
            try:
                deltas = array("i", offset_deltas)
            except OverflowError:
                raise ValueError("offset_deltas must fit in a signed 32-bit integer") from None
            keep.append(deltas)
            rin.offset_deltas = ffi.from_buffer("int32_t[]", deltas)
            last_delta = deltas[-1]
        hdr = self._hdr
        now = now_ms()
        if timestamps is None:
            rin.timestamps = ffi.NULL
            base_ts = max_ts = now
        else:
            if len(timestamps) != n:
                raise ValueError(f"timestamps has {len(timestamps)} items but values has {n}")
            try:
                ts = struct.pack(f"={n}q", *timestamps)
            except struct.error:
                bad = next((t for t in timestamps if not isinstance(t, int) or isinstance(t, bool)), None)
                if bad is not None:
                    raise TypeError(f"timestamps must be ints (ms since epoch), got {bad!r}") from None
                raise ValueError("timestamps must fit in a signed 64-bit integer") from None
            keep.append(ts)
            rin.timestamps = ffi.from_buffer("int64_t[]", ts)
            base_ts = timestamps[0]
            max_ts = max(timestamps)
        if headers is None:
            rin.header_counts = ffi.NULL
        else:
            if len(headers) != n:
                raise ValueError(f"headers has {len(headers)} items but values has {n}")
            counts = array("i")
            hkeys: list[bytes] = []
            hvals: list[bytes | None] = []
            for i, hs in enumerate(headers):
                c = 0
                for key, value in _header_pairs(hs or (), f"headers[{i}]"):
                    hkeys.append(key)
                    hvals.append(value)
                    c += 1
                counts.append(c)
            hk, hkl = _column(hkeys, "header keys", False)
            hv, hvl = _column(hvals, "header values", True)
            keep += (counts, hk, hkl, hv, hvl)
            rin.header_counts = ffi.from_buffer("int32_t[]", counts)
            rin.header_keys = ffi.from_buffer(hk)
            rin.header_key_lens = ffi.from_buffer("int32_t[]", hkl) if len(hkl) else ffi.NULL
            rin.header_values = ffi.from_buffer(hv)
            rin.header_value_lens = ffi.from_buffer("int32_t[]", hvl) if len(hvl) else ffi.NULL

        bound = lib.ls_records_bound(rin)
        check(bound)
        if last_offset_delta is not None:
            if last_offset_delta < last_delta:
                raise ValueError(f"last_offset_delta {last_offset_delta} is below the last record's delta {last_delta}")
            last_delta = last_offset_delta
        log_append = timestamp_type or log_append_time is not None
        attributes = codec | (lib.LS_ATTR_TIMESTAMP_TYPE if log_append else 0)
        if control:
            attributes |= lib.LS_ATTR_CONTROL
        if transactional:
            attributes |= lib.LS_ATTR_TRANSACTIONAL
        if delete_horizon is not None:
            attributes |= lib.LS_ATTR_DELETE_HORIZON
            base_ts = delete_horizon
        try:
            hdr.base_offset = base_offset
            hdr.partition_leader_epoch = partition_leader_epoch
            hdr.attributes = attributes
            hdr.base_timestamp = base_ts
            hdr.producer_id = producer_id
            hdr.producer_epoch = producer_epoch
            hdr.base_sequence = base_sequence
            hdr.last_offset_delta = last_delta
        except OverflowError as exc:
            raise ValueError(f"batch header field out of range: {exc}") from None
        if HEADER_SIZE + bound > len(self._scratch):
            self._scratch = bytearray(max(HEADER_SIZE + bound, 2 * len(self._scratch)))
        scratch = self._scratch
        out = ffi.from_buffer(scratch)
        if codec == compression.NONE and log_append_time is None and last_offset_delta is None and delete_horizon is None:
            size = check(lib.ls_batch_encode(rin, hdr, out, len(scratch)))
            self.last_max_timestamp = hdr.max_timestamp
            return bytes(scratch[:size]) if copy else memoryview(scratch)[:size]
        # Compressed or LogAppendTime: encode the records section, compress it, write the header.
        size = check(lib.ls_records_encode(rin, base_ts, out + HEADER_SIZE, len(scratch) - HEADER_SIZE))
        section = memoryview(scratch)[HEADER_SIZE : HEADER_SIZE + size]
        body = compression.compress(codec, section, level) if codec != compression.NONE else bytes(section)
        batch = bytearray(HEADER_SIZE + len(body))
        batch[HEADER_SIZE:] = body
        hdr.max_timestamp = max_ts if log_append_time is None else log_append_time
        self.last_max_timestamp = hdr.max_timestamp
        hdr.last_offset_delta = last_delta
        hdr.records_count = n
        check(lib.ls_batch_finish(ffi.from_buffer(batch), len(batch), hdr))
        return bytes(batch) if copy else batch


# ====================================================================== decoding
class _NoHeaders(list):  # type: ignore[type-arg]
    """The empty, read-only headers list shared by every record that has no headers."""

    __slots__ = ()

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("Record.headers of a record without headers is a shared read-only list; copy it first")

    append = extend = insert = remove = pop = clear = sort = reverse = _read_only  # type: ignore[assignment]
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "[]"


#: Shared by all records without headers (saves an allocation per record on the read path).
NO_HEADERS: list[tuple[str, bytes | None]] = _NoHeaders()


def _int64s(ptr: Any, n: int) -> list[int]:
    return memoryview(ffi.buffer(ptr, 8 * n)).cast("q").tolist()


def _int32s(ptr: Any, n: int) -> list[int]:
    return memoryview(ffi.buffer(ptr, 4 * n)).cast("i").tolist()


def _slices(buf: Any, positions: list[int], lengths: list[int], n: int) -> Any:
    nulls = lengths.count(-1)
    if nulls == 0:
        return [buf[p : p + l] for p, l in zip(positions, lengths)]
    if nulls == n:
        return repeat(None, n)
    return [buf[p : p + l] if l >= 0 else None for p, l in zip(positions, lengths)]


#: bytes a row takes in a decoder's Arrow columns (:class:`ArrowColumns`): offset 8, timestamp
#: 8, type 4, two views 16 each (plus a bit each in two bitmaps)
ARROW_ROW_BYTES = 52
#: bytes a row takes in a decoder's row arrays: offset and timestamp 8 each, seven int32
#: positions, lengths and counts, the timestamp type 1
ROW_ARRAY_BYTES = 45
#: decoders of at least this many rows keep their row arrays in an arena (see RecordDecoder._alloc)
ROWS_IN_ARENA = 16384


def _arena_memory(size: int) -> Any:
    """``size`` bytes of an arena (``ls_arena_alloc``: recycled, already mapped where it can
    be), as a ``char *`` that gives the arena back when garbage."""
    arena = lib.ls_arena_alloc(size)
    if arena == ffi.NULL:
        raise MemoryError(f"cannot map {size} bytes for decoded rows")
    return ffi.gc(ffi.cast("char *", arena), lambda p, size=size: lib.ls_arena_free(p, size), size=size)


class ArrowColumns(NamedTuple):
    """The memory of a views decoder's Arrow columns (see :meth:`RecordDecoder.take_arrow_columns`):
    ``owner`` (a cffi pointer that frees the memory when garbage) and the address of each column's
    row 0. Immutable; the memory it describes is written only by the decoder that made it, until
    the decoder hands it over."""

    owner: Any
    offsets: int
    timestamps_us: int
    timestamp_types: int
    key_views: int
    value_views: int
    key_valid: int
    value_valid: int


class RecordDecoder:
    """Decodes byte ranges of consecutive batches into :class:`Record` lists. Not thread-safe.

    Every batch is validated, CRC included, before any of its records is returned; a batch that
    fails raises :class:`CorruptRecordError` naming the file, the batch's position and the stored
    and computed CRC. Decompressed sizes are bounded by ``max_decompressed_bytes``. With
    ``views``, :meth:`decode_columns` also hands its sink each row's key and value as Arrow
    BinaryView views (``out.key_views``, ``out.value_views``), written during the walk.
    """

    def __init__(self, capacity: int = 4096, max_batch_bytes: int = 0, max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES,
                 views: bool = False) -> None:
        self.views = views
        self.max_batch_bytes = max_batch_bytes
        self.max_decompressed_bytes = max_decompressed_bytes
        self._cur = ffi.new("ls_cursor *")
        #: why the last decode() stopped: an LS_STOP_ value
        self.last_stop = lib.LS_STOP_END
        self._key_columns: tuple[list[bytes | None], list[int], list[bool]] | None = None
        self._sink: Callable[[Any, Any, int], None] | None = None
        self._want: int | None = None  # decode(max_records=..., exact=True): Records past it are not built
        #: running totals of what decode() consumed: batch bytes, and records returned
        self.bytes_decoded = 0
        self.records_decoded = 0
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        """(Re)allocate the row arrays. Callers holding ``self._out`` must re-read it: the old
        struct and arrays are freed with the last reference."""
        self.capacity = capacity
        out = ffi.new("ls_records_out *")
        if capacity >= ROWS_IN_ARENA:
            # One arena for all ten arrays (int64s, then int32s, then the int8s): a recycled,
            # already mapped 2 MiB where a calloc of their 1.5 MB would map fresh pages, fault
            # each in and zero it at every read as Arrow (two decoders a read: ~600 page faults).
            # Rows are written by the walk before anything reads them: no zeroing needed.
            owner = _arena_memory(ROW_ARRAY_BYTES * capacity)
            at = [8 * capacity * i for i in range(2)] + [16 * capacity + 4 * capacity * i for i in range(7)]
            self._arrays = (
                ffi.cast("int64_t *", owner + at[0]), ffi.cast("int64_t *", owner + at[1]),
                ffi.cast("int8_t *", owner + 44 * capacity),
                *(ffi.cast("int32_t *", owner + a) for a in at[2:]),
            )
            self._arrays_owner: Any = owner
        else:
            self._arrays = (
                ffi.new("int64_t[]", capacity), ffi.new("int64_t[]", capacity), ffi.new("int8_t[]", capacity),
                ffi.new("int32_t[]", capacity), ffi.new("int32_t[]", capacity), ffi.new("int32_t[]", capacity),
                ffi.new("int32_t[]", capacity), ffi.new("int32_t[]", capacity), ffi.new("int32_t[]", capacity),
                ffi.new("int32_t[]", capacity),
            )
            self._arrays_owner = None
        (out.offsets, out.timestamps, out.timestamp_types, out.key_pos, out.key_len, out.value_pos,
         out.value_len, out.headers_pos, out.headers_len, out.header_count) = self._arrays
        out.capacity = capacity
        out.count = 0
        self._out = out
        if self.views:
            self._arena = self._new_arena(capacity)

    def _new_arena(self, capacity: int) -> ArrowColumns:
        """Fresh memory (an arena, see ``ls_arena_alloc``) for the Arrow columns of ``capacity``
        rows that the walk writes with ``views``: offsets, timestamps (us), timestamp types
        (int32), key and value views and validity bitmaps, each 64-byte aligned; ``self._out``
        points at it."""
        rows = -(-capacity // 512) * 512  # every column and bitmap a multiple of 64 bytes long
        owner = _arena_memory(ARROW_ROW_BYTES * rows + rows // 4)
        base = int(ffi.cast("uintptr_t", owner))
        columns = ArrowColumns(owner, base, base + 8 * rows, base + 16 * rows, base + 20 * rows, base + 36 * rows,
                               base + 52 * rows, base + 52 * rows + rows // 8)
        out = self._out
        out.offsets = ffi.cast("int64_t *", columns.offsets)
        out.timestamps_us = ffi.cast("int64_t *", columns.timestamps_us)
        out.timestamp_types32 = ffi.cast("int32_t *", columns.timestamp_types)
        out.key_views = ffi.cast("uint8_t *", columns.key_views)
        out.value_views = ffi.cast("uint8_t *", columns.value_views)
        out.key_valid = ffi.cast("uint8_t *", columns.key_valid)
        out.value_valid = ffi.cast("uint8_t *", columns.value_valid)
        return columns

    def take_arrow_columns(self) -> ArrowColumns:
        """With ``views``, during a :meth:`decode_columns` sink call: the memory of the rows'
        Arrow columns (``out.offsets``, ``out.timestamps_us``, ``out.timestamp_types32``, the
        views and the validity bitmaps), handed over to the caller, who may keep it as long as
        it likes (it is freed with the last reference to ``owner``); the decoder writes the next
        rows into fresh memory."""
        if not self.views:
            raise ValueError("a decoder without views writes no Arrow columns")
        taken = self._arena
        self._arena = self._new_arena(self.capacity)
        return taken

    def _rows(self, buf: Any, into: list[Record]) -> None:
        """Append Records for the decoded rows, keys/values copied from ``buf``; reset rows.

        This is the read path's per-record cost: the Records are built in C
        (``_native._records.build``: the ints, the bytes and the tuple of each row, no
        intermediate lists); decode_keys() takes its three columns with one C-speed call each.
        """
        out = self._out
        n = out.count
        if n == 0:
            return
        if self._sink is not None:  # decode_columns(): the caller takes the C columns as they are
            try:
                self._sink(buf, out, n)
            finally:
                out.count = 0
            return
        out.count = 0
        if self._want is not None and self._key_columns is None:
            # decode(exact=True): the C walk returns at most the rows still wanted (partial
            # cursor); a compressed batch comes whole, and its Records past them are not built.
            n = min(n, self._want - len(into))
            if n <= 0:
                return
        if self._key_columns is not None:  # decode_keys(): offsets, keys and null values only
            first = out.offsets[0]
            if out.offsets[n - 1] - first == n - 1:
                offsets: Any = range(first, first + n)  # offsets strictly increase, so contiguous
            else:
                offsets = _int64s(out.offsets, n)
            keys_out, offsets_out, nulls_out = self._key_columns
            keys_out.extend(_slices(buf, _int32s(out.key_pos, n), _int32s(out.key_len, n), n))
            offsets_out.extend(offsets)
            value_lens = _int32s(out.value_len, n)
            nulls_out.extend([length < 0 for length in value_lens] if -1 in value_lens else repeat(False, n))
            return
        build_records(Record, buf, int(ffi.cast("uintptr_t", out)), n, TIMESTAMP_TYPES, NO_HEADERS,
                      decode_headers, into)

    def decode(
        self,
        buf: Any,
        start: int,
        end: int,
        min_offset: int = 0,
        max_offset: int = -1,
        max_records: int | None = None,
        path: str | None = None,
        partial_tail_ok: bool = False,
        stop_before_damage: bool = False,
        exact: bool = False,
        memo: Any = None,
    ) -> tuple[list[Record], int]:
        """Decode the batches in ``buf[start, end)``.

        Args:
            buf: a bytes-like object (bytes, mmap) holding the segment bytes.
            start, end: the byte range; ``start`` must be a batch boundary.
            min_offset: records below this offset are skipped (batches wholly below it too).
            max_offset: stop before the first batch whose base offset is >= this (-1: no limit).
            max_records: stop once at least this many records are decoded (whole batches).
            path: file name for error messages; positions in errors are positions in ``buf``.
            partial_tail_ok: a batch cut off by ``end`` ends the range instead of being an error
                (reads with a byte budget cut the range at an arbitrary position).
            stop_before_damage: an invalid batch after good ones ends the range, returning the
                good records (Kafka's reads do this; the read starting at the bad batch raises).
            exact: decode at most ``max_records`` rows (with max_records): a batch's records
                past them are not decoded, the position returned is after the last batch that
                gave rows, and a read of one record builds one Record, not its batch's 1,000.
                Every batch giving rows is still validated whole, CRC and every record, unless
                ``memo`` remembers it.
            memo: with ``exact``, an ``ls_crc_memo *`` (see ``LogSegment``) for this ``buf``:
                the batches validated whole are remembered there by position and stored CRC,
                and a remembered batch is neither CRC-checked again nor walked past the rows
                returned (a point read then costs microseconds, not its batch's CRC).

        Returns:
            (records, position after the last batch consumed).

        Raises:
            CorruptRecordError: an invalid batch inside the range.
        """
        records: list[Record] = []
        partial = exact and max_records is not None
        self._want = max_records if partial else None
        cur = self._cur
        cur.position = start
        cur.batches = 0
        cur.prev_last_offset = -1
        cur.memo = memo if partial and memo is not None else ffi.NULL
        self.last_stop = lib.LS_STOP_END
        cptr = ffi.from_buffer(buf)
        out = self._out
        next_batch = 0  # records of a batch that must fit whole in the next call
        try:
            while True:
                # A partial walk returns a batch's rows up to the capacity and moves past the
                # batch: it may run only when every row still wanted fits (else the rest of a
                # batch that fills the arrays would be skipped); whole batches otherwise.
                cur.partial = partial and max_records - len(records) <= self.capacity  # type: ignore[operator]
                if cur.partial:
                    out.capacity = max(max_records - len(records), 1)  # type: ignore[operator]
                elif max_records is None:
                    out.capacity = self.capacity
                else:
                    # Limit the rows so that the C walk stops about where max_records is met
                    # (it stops before a batch that does not fit, and batches come whole), with
                    # room for the next batch's records. (The count is read before validation,
                    # so it is only a hint, capped by the capacity.)
                    room = max(max_records - len(records), next_batch, 1)
                    if end - cur.position >= HEADER_SIZE:
                        room = max(room, _RECORDS_COUNT.unpack_from(buf, cur.position + _RECORDS_COUNT_AT)[0])
                    out.capacity = min(self.capacity, room)
                rc = lib.ls_segment_decode(cptr, end, min_offset, max_offset, self.max_batch_bytes, cur, out)
                self._rows(buf, records)
                next_batch = 0
                stop = self.last_stop = cur.stop
                if rc < 0 or stop == lib.LS_STOP_ERROR:
                    rc = rc if rc < 0 else lib.LS_ERR_CORRUPT
                    if self._stop_quietly(rc, end, records, partial_tail_ok, stop_before_damage):
                        break
                    h = cur.header
                    check(rc, path, cur.position, stored_crc=h.crc, computed_crc=cur.computed_crc,
                          size=LOG_OVERHEAD + h.batch_length, limit=self.max_batch_bytes)
                if stop == lib.LS_STOP_END or stop == lib.LS_STOP_MAX_OFFSET:
                    break
                if max_records is not None and len(records) >= max_records:
                    break
                if stop == lib.LS_STOP_FULL:
                    next_batch = cur.header.records_count
                    if next_batch > self.capacity:
                        self._alloc(max(next_batch, 2 * self.capacity))
                        out = self._out
                    continue
                if stop == lib.LS_STOP_COMPRESSED:
                    try:
                        size = self._decode_compressed(buf, cur.position, min_offset, path, records)
                    except CorruptRecordError:
                        if self._sink is not None or (records and stop_before_damage):  # reported by the read starting there
                            self.last_stop = lib.LS_STOP_ERROR
                            break
                        raise
                    out = self._out  # the compressed batch may have grown the arrays
                    cur.prev_last_offset = cur.header.base_offset + cur.header.last_offset_delta
                    cur.position += size
                    cur.batches += 1
                    if max_records is not None and len(records) >= max_records:
                        break
                    continue
                raise AssertionError(f"unknown stop reason {stop}")  # pragma: no cover
        finally:
            ffi.release(cptr)
            self._out.capacity = self.capacity
            self._want = None
            cur.memo = ffi.NULL
        self.bytes_decoded += cur.position - start
        self.records_decoded += len(records)
        return records, cur.position

    def decode_keys(self, buf: Any, start: int, end: int, min_offset: int = 0, max_offset: int = -1,
                    path: str | None = None) -> tuple[list[bytes | None], list[int], list[bool], int]:
        """Like :meth:`decode`, but return only the keys, offsets and which values are null,
        without building Records or slicing values (what the cleaner needs to decide). Every
        batch is validated as in decode(); an invalid one raises CorruptRecordError.

        Returns (keys, offsets, null_values, position after the last batch consumed).
        """
        keys: list[bytes | None] = []
        offsets: list[int] = []
        nulls: list[bool] = []
        self._key_columns = (keys, offsets, nulls)
        try:
            _, position = self.decode(buf, start, end, min_offset, max_offset, None, path)
        finally:
            self._key_columns = None
        return keys, offsets, nulls, position

    @property
    def last_batch_offset(self) -> int:
        """Last offset of the last batch the latest decode consumed (-1: none)."""
        return int(self._cur.prev_last_offset)

    def decode_columns(self, buf: Any, start: int, end: int, sink: Callable[[Any, Any, int], None],
                       min_offset: int = 0, max_offset: int = -1, path: str | None = None) -> int:
        """Like :meth:`decode`, but hand each chunk of decoded rows to ``sink(buf, out, n)``
        instead of building Records: ``out`` is the C ``ls_records_out`` holding ``n`` rows whose
        key/value/header positions point into ``buf`` (the segment bytes, or the decompressed
        records of a compressed batch), valid only during the call. Every batch is validated,
        CRC included, before any of its rows reaches the sink.

        An invalid batch (offsets going backwards included) ends the decode without an error
        (``last_stop`` is then ``LS_STOP_ERROR`` and the returned position is the bad batch's):
        the caller decides whether it is the zero or torn tail of an active segment or damage
        to report.

        Returns the position after the last batch consumed.
        """
        self._sink = sink
        try:
            _, position = self.decode(buf, start, end, min_offset, max_offset, None, path)
        finally:
            self._sink = None
        return position

    def _stop_quietly(self, rc: int, end: int, records: list[Record], partial_tail_ok: bool,
                      stop_before_damage: bool) -> bool:
        """Decide whether an invalid batch ends this decode without an error.

        A batch cut off by a byte budget (its declared size runs past ``end``) is no error when
        the caller allows a partial tail. A damaged batch after good ones ends the range: the
        records before it are returned and the read that starts at the bad batch raises (as
        Kafka does). But offsets going backwards cast doubt on the batch before as well, so that
        raises at once, whatever was decoded.
        """
        cur = self._cur
        h = cur.header
        if rc == lib.LS_ERR_TRUNCATED and partial_tail_ok:
            available = end - cur.position
            if available < HEADER_SIZE or LOG_OVERHEAD + h.batch_length > available:
                return True
        if self._sink is not None:
            return True  # decode_columns(): the caller judges the damage (or zero tail)
        if rc == lib.LS_ERR_CORRUPT and h.base_offset <= cur.prev_last_offset:
            return False
        return stop_before_damage and bool(records)

    def _decode_compressed(self, buf: Any, position: int, min_offset: int, path: str | None,
                           records: list[Record]) -> int:
        """Decompress and decode the compressed batch the C walk stopped at. The walk validated
        it (header, CRC) before stopping, so its header in the cursor is trusted as is."""
        hdr = ffi.addressof(self._cur, "header")
        size = LOG_OVERHEAD + hdr.batch_length
        codec = hdr.attributes & lib.LS_ATTR_COMPRESSION_MASK
        section = memoryview(buf)[position + HEADER_SIZE : position + size]
        try:
            try:
                raw = compression.decompress(codec, section, self.max_decompressed_bytes)
            except CorruptRecordError as exc:
                raise CorruptRecordError(path, position, exc.reason) from None
            except ValueError:  # codec ids 5-7 do not exist
                raise CorruptRecordError(path, position, f"unknown compression codec {codec}") from None
            needed = hdr.records_count
            if needed > self.capacity:
                self._alloc(max(needed, 2 * self.capacity))
            self._out.capacity = self.capacity  # a compressed batch is decoded whole
            rc = lib.ls_records_decode(raw, len(raw), hdr, min_offset, self._out)
            check(rc, path, position)
            self._rows(raw, records)
        finally:
            section.release()
        return size


def decode_batches(buf: bytes | bytearray | memoryview, min_offset: int = 0) -> list[Record]:
    """Decode every record of the consecutive batches in ``buf`` (thread-safe, allocates)."""
    records, _ = RecordDecoder().decode(buf, 0, len(buf), min_offset)
    return records


#: The 61-byte header, big-endian, in ls_header_load's field order and signedness: the one parser
#: of batch headers on the Python side (a struct unpack, not a C call and a cffi struct per header:
#: measured 0.11-0.16 s against 0.37 s for the headers of 100,000 batches, 200 MB).
_HEADER = struct.Struct(">qiibIhiqqqhii")
_make_header = BatchHeader._make
#: The header's last field alone (the decoder's hint of a batch's rows before it validates it).
_RECORDS_COUNT = struct.Struct(">i")
_RECORDS_COUNT_AT = HEADER_SIZE - 4


def parse_header(buf: Any, position: int = 0) -> BatchHeader:
    """Return the header of the batch at ``position`` without validating it. Thread-safe.

    Raises:
        CorruptRecordError: fewer than HEADER_SIZE bytes from ``position`` ("batch is truncated").
    """
    if position < 0 or len(buf) - position < HEADER_SIZE:
        check(lib.LS_ERR_TRUNCATED, None, position)
    return _make_header(_HEADER.unpack_from(buf, position))


#: the bytes of a log entry's start that :func:`entry_extent` reads (a RecordBatch v2's header up
#: to its last offset delta; 12 suffice for a legacy message set's entry)
ENTRY_HEAD_SIZE = 27


def entry_extent(head: bytes) -> tuple[int, int]:
    """(size in bytes, last offset) of the log entry whose first bytes are ``head`` (at least 12,
    :data:`ENTRY_HEAD_SIZE` for a v2 batch): a RecordBatch v2's base offset plus its last offset
    delta, or a legacy (v0/v1) message's own offset, which for a compressed wrapper is its last
    inner message's. The entry is not validated: read it from bytes already checked."""
    last = int.from_bytes(head[:8], "big")
    if len(head) >= ENTRY_HEAD_SIZE and head[16] == 2:
        last += int.from_bytes(head[23:27], "big")
    return 12 + int.from_bytes(head[8:12], "big"), last


def batch_headers(buf: Any, start: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each batch of ``buf[start:end]``, which holds whole consecutive
    batches (as read_raw and fetch answers do, and the valid prefix of a segment that
    :class:`logstore.log.segmentscan.BatchWalk` found); headers are parsed, not validated.

    Raises:
        CorruptRecordError: the range ends inside a batch header.
    """
    position, size, unpack = start, len(buf) if end is None else end, _HEADER.unpack_from
    while position < size:
        if size - position < HEADER_SIZE:
            check(lib.LS_ERR_TRUNCATED, None, position)
        header = _make_header(unpack(buf, position))
        yield position, header
        position += header.size


def end_offset_of(buf: Any, offset: int) -> int:
    """The offset after the whole batches in ``buf`` (``offset`` when it holds none)."""
    for _, header in batch_headers(buf):
        offset = max(offset, header.last_offset + 1)
    return offset


def validate_batch(buf: Any, position: int = 0, max_batch_bytes: int = 0, path: str | None = None) -> BatchHeader:
    """Validate the batch at ``position`` (header sanity and CRC) and return its header."""
    hdr = ffi.new("ls_batch_header *")
    crc = ffi.new("uint32_t *")
    cptr = ffi.from_buffer(buf)
    try:
        size = lib.ls_batch_validate(cptr + position, len(buf) - position, max_batch_bytes, hdr, crc)
    finally:
        ffi.release(cptr)
    check(size, path, position, stored_crc=hdr.crc, computed_crc=crc[0],
          size=LOG_OVERHEAD + hdr.batch_length, limit=max_batch_bytes)
    return BatchHeader.from_c(hdr)


_CLIENT_FORBIDDEN = {"control": lib.LS_ATTR_CONTROL, "delete horizon": lib.LS_ATTR_DELETE_HORIZON}


def validate_client_batch(buf: Any, max_message_bytes: int, what: str = "produced batch") -> BatchHeader:
    """Check a record batch encoded by a client before a leader appends it as it is (Kafka's
    LogValidator for magic 2): exactly one batch filling ``buf``, a valid CRC, every record
    well formed (a compressed batch is decompressed to check), records_count >= 1 with offset
    deltas 0..n-1, neither the control nor the delete-horizon flag (the log writes those), the
    transactional flag only with a producer id, and within ``max_message_bytes``. Returns its
    header. Thread-safe.

    Raises:
        CorruptRecordError: the bytes are not a valid batch.
        InvalidRecordError: a valid batch a client may not send.
        RecordTooLargeError: larger than ``max_message_bytes``.
    """
    n = len(buf)
    if n < HEADER_SIZE:
        raise CorruptRecordError(None, 0, f"{what}: {n} bytes is shorter than a batch header ({HEADER_SIZE})")
    if max_message_bytes > 0 and n > max_message_bytes:
        raise RecordTooLargeError(n, max_message_bytes)
    header = parse_header(buf)
    if header.compression == compression.NONE and _scan_whole(buf, n, header.base_offset) is None:
        # The common case: one C pass checked the CRC and walked every record; the header's
        # own rules are all that is left (a batch that fails the pass is checked again below,
        # step by step, so that it is refused with the same error as ever).
        return _client_header_rules(header, n, what)
    header = validate_batch(buf, 0, 0, what)
    _client_header_rules(header, n, what)
    if header.compression == compression.NONE:
        failed = _scan_whole(buf, n, header.base_offset)
        if failed is not None:
            raise CorruptRecordError(what, failed[0], reason(failed[1]))
    else:
        records, _ = RecordDecoder().decode(buf, 0, n, path=what)
        if len(records) != header.records_count:
            raise CorruptRecordError(what, 0, f"{len(records)} records decoded, {header.records_count} declared")
    return header


def _scan_whole(buf: Any, n: int, base_offset: int) -> tuple[int, int] | None:
    """One C pass over ``buf`` (uncompressed batches: CRC, header and every record): None when
    its ``n`` bytes are valid batches, else (the valid bytes before the failure, its status)."""
    res = ffi.new("ls_scan_result *")
    cptr = ffi.from_buffer(buf)
    try:
        lib.ls_segment_scan(cptr, n, base_offset, 0, 0, ffi.NULL, 0, ffi.NULL, 0, res)
    finally:
        ffi.release(cptr)
    if res.status != lib.LS_OK or res.valid_bytes != n:
        return res.valid_bytes, res.status
    return None


def _client_header_rules(header: BatchHeader, n: int, what: str) -> BatchHeader:
    """The rules of validate_client_batch that read only a (valid) batch's header."""
    if header.size != n:
        raise CorruptRecordError(what, 0, f"the batch is {header.size} bytes but {n} bytes were sent "
                                          "(one batch per produce)")
    for name, bit in _CLIENT_FORBIDDEN.items():
        if header.attributes & bit:
            raise InvalidRecordError(f"{what}: a client may not send a {name} batch")
    if header.records_count < 1 or header.last_offset_delta != header.records_count - 1:
        raise InvalidRecordError(f"{what}: {header.records_count} records with last offset delta "
                                 f"{header.last_offset_delta} (a client batch holds records 0..n-1)")
    if header.producer_id >= 0 and (header.producer_epoch < 0 or header.base_sequence < 0):
        raise InvalidRecordError(f"{what}: producer id {header.producer_id} without epoch and sequence")
    if header.attributes & lib.LS_ATTR_TRANSACTIONAL and header.producer_id < 0:
        raise InvalidRecordError(f"{what}: a transactional batch without a producer id")
    if header.compression > compression.ZSTD:
        # Kafka's CompressionType.forId knows 0-4: ids 5-7 are no codec a client may send
        raise UnsupportedCodecError(f"{what}: unknown compression codec id {header.compression} (known: 0-4)")
    return header

