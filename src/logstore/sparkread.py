"""An executor's side of a Spark read: one OffsetRange decoded into Arrow record batches.

The executor that runs an input partition maps the segment files read-only, decodes the batches
with the C decoder (every batch's CRC checked) and builds Arrow record batches straight from the
decoded columns (keys and values gathered by C into Arrow buffers). It needs the store's
directory at the same path as the driver (local mode, or a shared mount). Thread-safety: each
call of :func:`read_range` has its own decoder and buffers; nothing is shared.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import replace
from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from ._native import ffi, lib
from .errors import LogstoreError
from .logview import DataLossError, PartitionView, SegmentPosition
from .records import RecordDecoder
from .sparkoptions import schema_struct
from .sparkplan import OffsetRange

__all__ = ["arrow_schema", "read_range", "ROWS_PER_BATCH"]


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark expects of the source's record batches."""
    return to_arrow_schema(schema_struct(include_headers), timezone="UTC")


ROWS_PER_BATCH = 32768  # rows per Arrow record batch (the decoder's chunk)


def read_range(r: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Decode one OffsetRange into Arrow record batches (what an executor runs)."""
    if r.end <= r.start:
        return
    builder = _ArrowBuilder(r)
    view = PartitionView(r.root, r.topic, r.partition)
    start = r.start
    hint = SegmentPosition(r.segment, r.position) if r.segment >= 0 else None
    stop_at = SegmentPosition(r.stop_segment, r.stop_position) if r.stop_segment >= 0 else None
    try:
        for _ in view.scan(start, r.end, builder.sink, RecordDecoder(capacity=ROWS_PER_BATCH), hint,
                           stop_at=stop_at):
            yield from builder.take()
            if builder.done:
                return
    except DataLossError:
        if r.fail_on_data_loss:
            raise
        # The records are gone: read what is left of the range, if anything.
        restart = max(start, builder.next_offset, view.log_start_offset())
        if restart < r.end and restart > start:
            yield from read_range(replace(r, start=restart, segment=-1, position=0))
            return
    yield from builder.take()


class _ArrowBuilder:
    """The sink of PartitionView.scan: decoded C columns in, Arrow record batches out."""

    def __init__(self, r: OffsetRange) -> None:
        self.r = r
        self.schema = arrow_schema(r.include_headers)
        self._topic_scalar = pa.scalar(r.topic, pa.string())
        self._partition_scalar = pa.scalar(r.partition, pa.int32())
        self.batches: list[pa.RecordBatch] = []
        self.started = r.find_start_ts is None
        self.done = False
        self.next_offset = r.start
        self._headers_type = self.schema.field("headers").type if r.include_headers else None

    def take(self) -> list[pa.RecordBatch]:
        out, self.batches = self.batches, []
        return out

    def sink(self, buf: Any, out: Any, n: int) -> None:
        if self.done:
            return
        r = self.r
        offsets = ffi.buffer(out.offsets, 8 * n)
        first, last = 0, n
        # Rows past the range's end (inside its last batch) go.
        end_view = memoryview(offsets).cast("q")
        last = bisect_left(end_view, r.end)
        if last < n:
            self.done = True
        if not self.started:
            i = lib.ls_first_at_least(out.timestamps, last, r.find_start_ts)
            if i < 0:
                return
            self.started = True
            first = i
        if r.find_end_ts is not None:
            i = lib.ls_first_at_least(out.timestamps + first, last - first, r.find_end_ts)
            if i >= 0:
                last = first + i
                self.done = True
        if last <= first:
            return
        self.next_offset = end_view[last - 1] + 1
        self.batches.append(self._batch(buf, out, first, last))

    def _batch(self, buf: Any, out: Any, first: int, last: int) -> pa.RecordBatch:
        k = last - first
        cbuf = ffi.from_buffer(buf)
        try:
            keys = _binary(cbuf, len(buf), out.key_pos + first, out.key_len + first, k)
            values = _binary(cbuf, len(buf), out.value_pos + first, out.value_len + first, k)
            headers = self._headers(buf, out, first, last) if self._headers_type is not None else None
        finally:
            ffi.release(cbuf)
        offsets = pa.Array.from_buffers(pa.int64(), k, [None, pa.py_buffer(ffi.buffer(out.offsets + first, 8 * k)[:])])
        us = ffi.new("int64_t[]", k)
        lib.ls_ms_to_us(out.timestamps + first, k, us)
        timestamps = pa.Array.from_buffers(self.schema.field("timestamp").type, k, [None, pa.py_buffer(ffi.buffer(us))])
        types32 = ffi.new("int32_t[]", k)
        lib.ls_widen_int8(out.timestamp_types + first, k, types32)
        ttypes = pa.Array.from_buffers(pa.int32(), k, [None, pa.py_buffer(ffi.buffer(types32))])
        topic = pa.repeat(self._topic_scalar, k)
        partition = pa.repeat(self._partition_scalar, k)
        columns = [keys, values, topic, partition, offsets, timestamps, ttypes]
        if headers is not None:
            columns.append(headers)
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def _headers(self, buf: Any, out: Any, first: int, last: int) -> pa.Array:
        rows: list[list[dict[str, Any]]] = []
        for i in range(first, last):
            count = out.header_count[i]
            if count == 0:
                rows.append([])
                continue
            pairs = RecordDecoder._headers(buf, out.headers_pos[i], out.headers_len[i], count)
            rows.append([{"key": k, "value": v} for k, v in pairs])
        return pa.array(rows, type=self._headers_type)


def _binary(cbuf: Any, size: int, pos: Any, lens: Any, k: int) -> pa.Array:
    """Gather k spans of the decoded buffer into an Arrow binary array (nulls for length -1)."""
    total = lib.ls_binary_size(lens, k)
    if total < 0:
        raise LogstoreError("decoded record lengths are invalid")
    data = ffi.new("char[]", max(total, 1))
    offsets = ffi.new("int32_t[]", k + 1)
    validity = ffi.new("uint8_t[]", (k + 7) // 8 or 1)
    nulls = ffi.new("int32_t *")
    rc = lib.ls_gather_binary(cbuf, size, pos, lens, k, offsets, validity, data, total, nulls)
    if rc < 0:
        raise LogstoreError(f"cannot gather decoded records into Arrow buffers (error {rc})")
    # Zero-copy: each ffi.buffer keeps its cffi allocation alive for as long as Arrow holds it.
    bitmap = pa.py_buffer(ffi.buffer(validity, (k + 7) // 8)) if nulls[0] else None
    return pa.Array.from_buffers(pa.binary(), k, [bitmap, pa.py_buffer(ffi.buffer(offsets)),
                                                  pa.py_buffer(ffi.buffer(data, total))], null_count=nulls[0])
