"""Decoded record columns as Arrow record batches, in the Spark Kafka source's schema.

The C decoder (``RecordDecoder.decode_columns``) leaves each chunk of rows as C columns: offsets,
timestamps and timestamp types as arrays, keys, values and headers as (position, length) spans
of the batch bytes. :class:`ArrowBuilder` is the sink that turns them into ``pyarrow``
record batches with no per-record Python work: the fixed-width columns are handed to Arrow as
buffers, keys and values gathered by C (``ls_gather_binary``) into Arrow's binary layout. Only
the ``headers`` column, when asked for, is built record by record.

With ``views=True`` keys and values are not copied at all: they become Arrow BinaryView
columns (``pyarrow.binary_view()``: 16 bytes per row, holding a value of at most 12 bytes
itself, else its length, first 4 bytes and place in a data buffer), written by one C call each
(``ls_binary_views``), whose data buffer is the segment's bytes themselves: a
:class:`~logstore.pinnedmap.PinnedMap` that the log registers (:meth:`ArrowBuilder.add_maps`) for
the segments a chunk reads, the decompressed bytes of a compressed batch, or the remote tier's
fetched bytes. Anything else (a segment that could not be pinned) is copied once per chunk, as
one span, into one buffer the views point into. The record batches keep those buffers alive.

The schema is the Spark Kafka source's (:data:`COLUMNS`): ``key`` and ``value`` binary (null
for a null key or value; ``binary_view`` with ``views=True``), ``topic`` string, ``partition`` int32, ``offset`` int64,
``timestamp`` in microseconds (UTC), ``timestampType`` int32 (0 create time, 1 log append time)
and, when asked for, ``headers`` as a list of (key string, value binary) structs.

pyarrow is an optional dependency (``logstore[arrow]``): this module imports it, so the modules
that use it import this one only when a caller asks for Arrow. Thread-safety: a builder belongs
to one reader; the module's functions may be called from any thread.
"""

from __future__ import annotations

import functools
from array import array
from bisect import bisect_left
from typing import Any, Sequence

import pyarrow as pa

from .._native import ffi, lib
from ..errors import LogstoreError
from .batch import ARROW_ROW_BYTES, decode_headers

__all__ = ["COLUMNS", "DEFAULT_COLUMNS", "ROWS_PER_BATCH", "schema", "check_columns", "ArrowBuilder"]

_VIEW = 16  # bytes of one BinaryView view
#: What a row takes of the decoder's arena (two views, offset, timestamp, type, two validity
#: bits), and the fewest bytes of rows for which a record batch takes the arena (2 MiB, held as
#: long as the batch lives) rather than copies of its rows: a chunk of a few rows (a small
#: compressed batch, a read of one record, a read_committed range) copied into buffers of its
#: own size, so that a table of many small chunks does not hold a huge page per chunk.
_ROW_BYTES = ARROW_ROW_BYTES + 1  # (the two validity bits rounded up to a byte)
_TAKE_AT_LEAST = 512 << 10

#: every column, in the Spark Kafka source's order
COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")
#: the columns given when none are named (the source's default: no headers)
DEFAULT_COLUMNS = COLUMNS[:-1]
#: rows per Arrow record batch (the decoder's chunk)
ROWS_PER_BATCH = 32768

_HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
_TYPES = {"key": pa.binary(), "value": pa.binary(), "topic": pa.string(), "partition": pa.int32(),
          "offset": pa.int64(), "timestamp": pa.timestamp("us", tz="UTC"), "timestampType": pa.int32(),
          "headers": pa.list_(pa.field("element", _HEADER))}


def check_columns(columns: Sequence[str] | None) -> tuple[str, ...]:
    """The columns to build, in the schema's order (None: :data:`DEFAULT_COLUMNS`).

    Raises:
        ValueError: an unknown or repeated column name, or none at all.
    """
    if columns is None:
        return DEFAULT_COLUMNS
    if isinstance(columns, str):
        raise ValueError(f"columns must be a sequence of names, not the string {columns!r}")
    names = list(columns)
    unknown = [c for c in names if c not in _TYPES]
    if unknown:
        raise ValueError(f"unknown column(s) {unknown}: the columns are {list(COLUMNS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"a column is named twice in {names}")
    if not names:
        raise ValueError("no columns asked for")
    return tuple(c for c in COLUMNS if c in names)


def schema(columns: Sequence[str] | None = None, views: bool = False) -> pa.Schema:
    """The Arrow schema of the given columns (default: :data:`DEFAULT_COLUMNS`); with ``views``
    the key and value columns are ``binary_view`` instead of ``binary``."""
    return pa.schema([pa.field(c, pa.binary_view() if views and c in ("key", "value") else _TYPES[c])
                      for c in check_columns(columns)])


class ArrowBuilder:
    """The sink of ``RecordDecoder.decode_columns``: rows with ``start <= offset < end`` in,
    Arrow record batches out (:meth:`take`).

    ``max_records`` stops after that many rows. ``start_timestamp`` skips the rows before the
    first whose timestamp is at least it; ``end_timestamp`` stops at the first row whose
    timestamp is at least it (the Spark source's bounds inside a planned range). ``views``: keys
    and values as BinaryView columns pointing into the bytes read (see the module's doc).
    """

    def __init__(self, topic: str, partition: int, start: int, end: int, columns: Sequence[str] | None = None,
                 max_records: int | None = None, start_timestamp: int | None = None,
                 end_timestamp: int | None = None, views: bool = False, decoder: Any = None) -> None:
        self.columns = check_columns(columns)
        self.views = views
        self._decoder = decoder if views and decoder is not None and decoder.views else None
        self.schema = schema(self.columns, views)
        self._maps: dict[int, tuple[Any, Any]] = {}
        self.start = start
        self.end = end
        self.left = max_records
        self.start_timestamp = start_timestamp
        self.end_timestamp = end_timestamp
        self.batches: list[pa.RecordBatch] = []
        self.done = end <= start or max_records == 0
        #: the offset after the last row taken (where a reader goes on)
        self.next_offset = start
        #: rows taken so far
        self.rows = 0
        self._topic = topic.encode("utf-8")
        self._partition = partition

    def add_maps(self, maps: Sequence[tuple[Any, Any]]) -> None:
        """Register (buffer, PinnedMap) pairs: rows decoded from ``buffer`` (a segment's own map,
        passed to :meth:`sink`) get views into the PinnedMap of the same file's bytes instead of
        copies. Replaces the pairs registered before."""
        self._maps = {id(buf): (buf, pinned) for buf, pinned in maps if buf is not None and pinned is not None}

    def take(self) -> list[pa.RecordBatch]:
        """The record batches built since the last call."""
        out, self.batches = self.batches, []
        return out

    def sink(self, buf: Any, out: Any, n: int) -> None:
        if self.done or n <= 0:
            return
        offsets = memoryview(ffi.buffer(out.offsets, 8 * n)).cast("q")
        first = bisect_left(offsets, self.start)
        last = bisect_left(offsets, self.end)
        if last < n:
            self.done = True
        if self.start_timestamp is not None and first < last:
            i = lib.ls_first_at_least(out.timestamps + first, last - first, self.start_timestamp)
            if i < 0:
                return
            first += i
            self.start_timestamp = None
        if self.end_timestamp is not None and first < last:
            i = lib.ls_first_at_least(out.timestamps + first, last - first, self.end_timestamp)
            if i >= 0:
                last = first + i
                self.done = True
        if self.left is not None and last - first >= self.left:
            last = first + self.left
            self.done = True
        if last <= first:
            return
        self.next_offset = offsets[last - 1] + 1
        self.rows += last - first
        if self.left is not None:
            self.left -= last - first
        self.batches.append(self._batch(buf, out, first, last))

    def _batch(self, buf: Any, out: Any, first: int, last: int) -> pa.RecordBatch:
        if self._decoder is not None and (last - first) * _ROW_BYTES >= _TAKE_AT_LEAST:
            data = self._views_data(buf, out)
            if data is not None:
                return self._taken_batch(buf, data, out, first, last)
        k = last - first
        arrays = []
        cbuf = ffi.from_buffer(buf)
        spans: Any = None
        try:
            for name in self.columns:
                if name in ("key", "value"):
                    pos, lens = (out.key_pos, out.key_len) if name == "key" else (out.value_pos, out.value_len)
                    if not self.views:
                        arrays.append(_binary(cbuf, len(buf), pos + first, lens + first, k))
                        continue
                    if spans is None:
                        spans = self._data_buffer(buf, cbuf, out, first, k)
                    decoded = (out.key_views if name == "key" else out.value_views) if spans[1] == 0 else ffi.NULL
                    if decoded != ffi.NULL:  # written by the decoder's walk: copied and checked
                        view = _taken_views(decoded + _VIEW * first, spans[0], lens + first, k)
                    else:
                        view = _views(cbuf, len(buf), spans, pos + first, lens + first, k)
                    if view is None:  # a long value outside the pinned bytes: copy the chunk's span
                        spans = _copied_span(cbuf, out, first, k, self.columns)
                        view = _views(cbuf, len(buf), spans, pos + first, lens + first, k)
                        if view is None:
                            raise LogstoreError("decoded record spans do not fit one Arrow data buffer")
                    arrays.append(view)
                elif name in ("topic", "partition"):
                    arrays.append(self._constant(name, k))
                elif name == "offset":
                    data, ptr = _buffer(8 * k)
                    ffi.memmove(ptr, out.offsets + first, 8 * k)
                    arrays.append(pa.Array.from_buffers(pa.int64(), k, [None, data]))
                elif name == "timestamp":
                    data, ptr = _buffer(8 * k)
                    lib.ls_ms_to_us(out.timestamps + first, k, ffi.cast("int64_t *", ptr))
                    arrays.append(pa.Array.from_buffers(_TYPES["timestamp"], k, [None, data]))
                elif name == "timestampType":
                    data, ptr = _buffer(4 * k)
                    lib.ls_widen_int8(out.timestamp_types + first, k, ffi.cast("int32_t *", ptr))
                    arrays.append(pa.Array.from_buffers(pa.int32(), k, [None, data]))
                else:
                    arrays.append(_headers(buf, out, first, last))
        finally:
            ffi.release(cbuf)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


    def _views_data(self, buf: Any, out: Any) -> pa.Buffer | None:
        """The data buffer the decoder's views of this chunk can point into as they are (their
        positions are into ``buf``): the PinnedMap registered for ``buf`` when it holds every long
        value (an empty buffer when there is none), ``buf`` itself when it is a bytes object; None
        when neither (the views are then rewritten over a copy)."""
        end = out.views_end
        pinned = self._maps.get(id(buf))
        if pinned is not None and pinned[0] is buf:
            if end == 0:
                return _buffer(0)[0]
            return pa.foreign_buffer(pinned[1].address, pinned[1].size, base=pinned[1]) if end <= pinned[1].size else None
        if type(buf) is bytes and end <= len(buf):
            return pa.py_buffer(buf)
        return None

    def _taken_batch(self, buf: Any, data: pa.Buffer, out: Any, first: int, last: int) -> pa.RecordBatch:
        """Rows [first, last) as a record batch whose columns are the memory the decoder wrote
        them into (taken from it: nothing is copied), the views pointing into ``data``."""
        taken = self._decoder.take_arrow_columns()
        owner, k, n = taken.owner, last - first, out.count

        def memory(address: int, size: int) -> pa.Buffer:
            return pa.foreign_buffer(address, size, base=owner)

        def views(address: int, valid: int, nulls: int) -> pa.Array:
            count = 0 if nulls == 0 else nulls if k == n else -1
            if first % 8 == 0:  # whole bytes of the bitmap: a plain array from row 0
                bitmap = memory(valid + first // 8, (k + 7) // 8) if nulls else None
                return pa.Array.from_buffers(pa.binary_view(), k, [bitmap, memory(address + _VIEW * first, _VIEW * k), data],
                                             null_count=count)
            bitmap = memory(valid, (last + 7) // 8) if nulls else None
            return pa.Array.from_buffers(pa.binary_view(), k, [bitmap, memory(address, _VIEW * last), data],
                                         null_count=count, offset=first)

        arrays = []
        for name in self.columns:
            if name == "key":
                arrays.append(views(taken.key_views, taken.key_valid, out.key_nulls))
            elif name == "value":
                arrays.append(views(taken.value_views, taken.value_valid, out.value_nulls))
            elif name in ("topic", "partition"):
                arrays.append(self._constant(name, k))
            elif name == "offset":
                arrays.append(pa.Array.from_buffers(pa.int64(), k, [None, memory(taken.offsets + 8 * first, 8 * k)]))
            elif name == "timestamp":
                arrays.append(pa.Array.from_buffers(_TYPES["timestamp"], k,
                                                    [None, memory(taken.timestamps_us + 8 * first, 8 * k)]))
            elif name == "timestampType":
                arrays.append(pa.Array.from_buffers(pa.int32(), k, [None, memory(taken.timestamp_types + 4 * first, 4 * k)]))
            else:
                arrays.append(_headers(buf, out, first, last))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _data_buffer(self, buf: Any, cbuf: Any, out: Any, first: int, k: int) -> tuple[pa.Buffer, int]:
        """(Arrow buffer, position in ``buf`` where it starts) that the views of rows
        [first, first + k) point into: the PinnedMap registered for ``buf`` (an empty buffer
        when every key and value is held in its view: the table then pins no file), ``buf``
        itself when it is an immutable bytes object, else a copy of the span the rows' long
        values cover."""
        pinned = self._maps.get(id(buf))
        if pinned is not None and pinned[0] is buf:
            start, end = _long_span(cbuf, out, first, k, self.columns)
            if end <= start:
                return _buffer(0)[0], 0
            return pa.foreign_buffer(pinned[1].address, pinned[1].size, base=pinned[1]), 0
        if type(buf) is bytes:
            return pa.py_buffer(buf), 0
        return _copied_span(cbuf, out, first, k, self.columns)

    def _constant(self, name: str, k: int) -> pa.Array:
        """The topic or partition column of k rows (a slice of a cached longer one)."""
        n = 1 << max(k, ROWS_PER_BATCH + 1).bit_length()  # a few sizes only, each cached
        return _constant_column(name, self._topic if name == "topic" else self._partition, n).slice(0, k)


@functools.lru_cache(maxsize=32)
def _constant_column(name: str, value: bytes | int, n: int) -> pa.Array:
    """n rows of one topic (utf-8 bytes) or partition, built from buffers. (Not pa.repeat of a
    pa.scalar: the first pa.scalar of a process imports pandas, half a second.)"""
    if name == "topic":
        assert isinstance(value, bytes)
        size = len(value)
        offsets = array("i", range(0, (n + 1) * size, size)) if size else array("i", [0]) * (n + 1)
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(value * n)])
    return pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(array("i", [value]) * n)])


def _headers(buf: Any, out: Any, first: int, last: int) -> pa.Array:
    rows: list[list[dict[str, Any]]] = []
    for i in range(first, last):
        count = out.header_count[i]
        if count == 0:
            rows.append([])
            continue
        pairs = decode_headers(buf, out.headers_pos[i], out.headers_len[i], count)
        rows.append([{"key": k, "value": v} for k, v in pairs])
    return pa.array(rows, type=_TYPES["headers"])


def _buffer(size: int) -> tuple[pa.Buffer, Any]:
    """A buffer from Arrow's memory pool (which reuses freed memory: no page faults on the
    way, unlike a fresh calloc) and a C pointer to write it through."""
    buf = pa.allocate_buffer(max(size, 1))
    return buf, ffi.cast("char *", buf.address)


def _copied_span(cbuf: Any, out: Any, first: int, k: int, columns: Sequence[str]) -> tuple[pa.Buffer, int]:
    """A copy of the span of ``cbuf`` that the long keys and values of rows [first, first + k)
    cover (one memcpy), and where it starts."""
    start, end = _long_span(cbuf, out, first, k, columns)
    data, ptr = _buffer(end - start)
    if end > start:
        ffi.memmove(ptr, cbuf + start, end - start)
    return data, start


def _long_span(cbuf: Any, out: Any, first: int, k: int, columns: Sequence[str]) -> tuple[int, int]:
    """[start, end) of ``cbuf`` covering the keys and values (of ``columns``) longer than 12
    bytes of rows [first, first + k); start == end when there is none."""
    lo, hi = ffi.new("int64_t *"), ffi.new("int64_t *")
    start, end = None, 0
    for name in ("key", "value"):
        if name not in columns:
            continue
        pos, lens = (out.key_pos, out.key_len) if name == "key" else (out.value_pos, out.value_len)
        if lib.ls_view_span(pos + first, lens + first, k, len(cbuf), lo, hi) < 0:
            raise LogstoreError("decoded record lengths are invalid")
        if hi[0] > lo[0]:
            start = lo[0] if start is None else min(start, lo[0])
            end = max(end, hi[0])
    if start is None:
        start = end = 0
    return start, end


def _views(cbuf: Any, size: int, data: tuple[pa.Buffer, int], pos: Any, lens: Any, k: int) -> pa.Array | None:
    """k spans of the decoded buffer as a BinaryView array whose long values point into
    ``data`` (an Arrow buffer holding ``cbuf``'s bytes from the position it names); None when a
    long value lies outside it."""
    buffer, base = data
    return _view_array(buffer, k, "write Arrow views of decoded records",
                       lambda views, validity, nulls: lib.ls_binary_views(
                           cbuf, size, base, min(buffer.size, size - base), pos, lens, k, 0, views, validity, nulls))


def _taken_views(decoded: Any, buffer: pa.Buffer, lens: Any, k: int) -> pa.Array | None:
    """The decoder's k views as a BinaryView array over ``buffer`` (the decoded bytes from
    position 0); None when a long value lies past it."""
    return _view_array(buffer, k, "take the decoder's Arrow views",
                       lambda views, validity, nulls: lib.ls_take_views(decoded, lens, k, buffer.size, views,
                                                                        validity, nulls))


def _view_array(buffer: pa.Buffer, k: int, what: str, write: Any) -> pa.Array | None:
    """A BinaryView array of k rows over data buffer ``buffer``, its views and validity written
    by ``write(views, validity, null_count)`` (a C call's result: LS_ERR_NOSPACE gives None)."""
    views, views_ptr = _buffer(_VIEW * k)
    validity, validity_ptr = _buffer((k + 7) // 8)
    nulls = ffi.new("int32_t *")
    rc = write(ffi.cast("uint8_t *", views_ptr), ffi.cast("uint8_t *", validity_ptr), nulls)
    if rc == lib.LS_ERR_NOSPACE:
        return None
    if rc < 0:
        raise LogstoreError(f"cannot {what} (error {rc})")
    return pa.Array.from_buffers(pa.binary_view(), k, [validity if nulls[0] else None, views, buffer],
                                 null_count=nulls[0])


def _binary(cbuf: Any, size: int, pos: Any, lens: Any, k: int) -> pa.Array:
    """Gather k spans of the decoded buffer into an Arrow binary array (nulls for length -1)."""
    total = lib.ls_binary_size(lens, k)
    if total < 0:
        raise LogstoreError("decoded record lengths are invalid")
    data, data_ptr = _buffer(total)
    offsets, offsets_ptr = _buffer(4 * (k + 1))
    validity, validity_ptr = _buffer((k + 7) // 8)
    nulls = ffi.new("int32_t *")
    rc = lib.ls_gather_binary(cbuf, size, pos, lens, k, ffi.cast("int32_t *", offsets_ptr),
                              ffi.cast("uint8_t *", validity_ptr), data_ptr, total, nulls)
    if rc < 0:
        raise LogstoreError(f"cannot gather decoded records into Arrow buffers (error {rc})")
    return pa.Array.from_buffers(pa.binary(), k, [validity if nulls[0] else None, offsets, data], null_count=nulls[0])
