"""An executor's side of a Spark read: one OffsetRange decoded into Arrow record batches.

The executor that runs an input partition maps the segment files read-only, decodes the batches
with the C decoder (every batch's CRC checked) and builds Arrow record batches straight from the
decoded columns with :class:`~logstore.records.arrow.ArrowBuilder`, the same code as
``Log.read_arrow``. It needs the store's directory at the same path as the driver (local mode,
or a shared mount). Thread-safety: each call of :func:`read_range` has its own decoder and
buffers; nothing is shared.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import pyarrow as pa

from ..records import arrow as arrowread
from ..records.arrow import ROWS_PER_BATCH, ArrowBuilder
from ..store.views import DataLossError, PartitionView, SegmentPosition
from ..records.batch import RecordDecoder
from .plan import OffsetRange

__all__ = ["arrow_schema", "read_range", "ROWS_PER_BATCH"]


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark expects of the source's record batches (``arrowread``'s)."""
    return arrowread.schema(_columns(include_headers))


def _columns(include_headers: bool) -> tuple[str, ...]:
    return arrowread.COLUMNS if include_headers else arrowread.DEFAULT_COLUMNS


def read_range(r: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Decode one OffsetRange into Arrow record batches (what an executor runs)."""
    if r.end <= r.start:
        return
    columns = r.columns or _columns(r.include_headers)
    aborted = PartitionView(r.root, r.topic, r.partition).aborted_batches(r.start, r.end) if r.read_committed else []
    if aborted:
        # read_committed over aborted transactions: the offsets decide which rows go, so the
        # offset column is built (and dropped again when the query did not ask for it).
        built = tuple(columns) if "offset" in columns else tuple(columns) + ("offset",)
        builder = ArrowBuilder(r.topic, r.partition, r.start, r.end, built,
                               start_timestamp=r.find_start_ts, end_timestamp=r.find_end_ts)
        for batch in _batches(r, builder):
            kept = _without(batch, aborted)
            if kept.num_rows:
                yield kept.select(list(columns))
        return
    builder = ArrowBuilder(r.topic, r.partition, r.start, r.end, columns,
                           start_timestamp=r.find_start_ts, end_timestamp=r.find_end_ts)
    if builder.columns != columns:  # a user-specified schema's order: a zero-copy selection
        for batch in _batches(r, builder):
            yield batch.select(list(columns))
        return
    yield from _batches(r, builder)


def _without(batch: pa.RecordBatch, aborted: list[tuple[int, int]]) -> pa.RecordBatch:
    """``batch`` without the rows whose offset lies in one of the ``aborted`` (first, last)
    ranges (ascending, disjoint; Arrow compute only, no numpy)."""
    import pyarrow.compute as pc

    if batch.num_rows == 0:
        return batch
    offsets = batch.column(batch.schema.get_field_index("offset"))
    low, high = offsets[0].as_py(), offsets[batch.num_rows - 1].as_py()  # (rows come in offset order)
    inside = None
    for first, last in aborted:
        if last < low or first > high:
            continue
        hit = pc.and_(pc.greater_equal(offsets, first), pc.less_equal(offsets, last))
        inside = hit if inside is None else pc.or_(inside, hit)
    return batch if inside is None else batch.filter(pc.invert(inside))


def _batches(r: OffsetRange, builder: ArrowBuilder) -> Iterator[pa.RecordBatch]:
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
