"""An executor's side of a Spark read: one OffsetRange decoded into Arrow record batches.

The executor that runs an input partition maps the segment files read-only, decodes the batches
with the C decoder (every batch's CRC checked) and builds Arrow record batches straight from the
decoded columns with :class:`~logstore.records.arrow.ArrowBuilder`, the same code as
``Log.read_arrow``. It needs the store's directory at the same path as the driver (local mode,
or a shared mount). The part of a range in the remote tier (tiered storage) it reads from the
object store itself, with ranged gets of whole batches
(:class:`~logstore.store.remoteview.RemotePartitionView`: no broker, no local copy), every batch
CRC-checked and decoded by the same decoder into the same builder. Thread-safety: each call of
:func:`read_range` has its own decoder, buffers and object store client; nothing is shared.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import pyarrow as pa

from ..records import arrow as arrowread
from ..records.arrow import ROWS_PER_BATCH, ArrowBuilder
from ..store.remoteview import RemotePartitionView
from ..store.views import DataLossError, PartitionView, SegmentPosition, StoreView
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
    aborted = _aborted_batches(r) if r.read_committed else []
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


def _remote(r: OffsetRange) -> RemotePartitionView:
    """The remote tier of the range's remote part (its segments only; the object store is
    opened on the first read)."""
    return RemotePartitionView(r.remote_segments[0].topic_id_partition, r.remote_segments, r.remote_storage,
                               dict(r.remote_options))


def _remote_from_start(r: OffsetRange) -> RemotePartitionView:
    """The partition's remote tier from the segment holding the range's start to its last
    remote segment (the range's own when the metadata is not readable here)."""
    store = StoreView(r.root, remote_storage=r.remote_storage, remote_storage_options=dict(r.remote_options))
    view = store.partition(r.topic, r.partition).remote
    segments = view.segments_in(r.start, 1 << 62) if view is not None else []
    return RemotePartitionView(r.remote_segments[0].topic_id_partition, segments or list(r.remote_segments),
                               r.remote_storage, dict(r.remote_options))


def _aborted_batches(r: OffsetRange) -> list[tuple[int, int]]:
    """The range's batches of aborted transactions, (first, last) ascending: below
    ``local_from`` the remote batches, above it the local ones. A transaction's entry lives in
    the index of the segment holding its ABORT marker, which may come after the range: the
    remote part is checked against every remote segment's index from the range's start on and
    the local segments' too (Kafka's collectAbortedTransactions goes on until it is complete)."""
    out: list[tuple[int, int]] = []
    start = r.start
    if r.local_from >= 0:
        if r.remote_segments:
            local = PartitionView(r.root, r.topic, r.partition).aborted_transactions(start, r.end)
            with _remote_from_start(r) as remote:
                out += remote.aborted_batches(start, min(r.end, r.local_from), more=local)
        start = r.local_from
    if start < r.end:
        out += PartitionView(r.root, r.topic, r.partition).aborted_batches(start, r.end)
    return out


def _batches(r: OffsetRange, builder: ArrowBuilder) -> Iterator[pa.RecordBatch]:
    decoder = RecordDecoder(capacity=ROWS_PER_BATCH)
    start = r.start
    if r.local_from >= 0:  # tiered storage: the offsets below local_from from the object store
        if r.remote_segments:
            with _remote(r) as remote:
                for _ in remote.scan(start, min(r.end, r.local_from), builder.sink, decoder,
                                     skip_lost=not r.fail_on_data_loss):
                    yield from builder.take()
                    if builder.done:
                        return
        start = r.local_from
        if start >= r.end:
            yield from builder.take()
            return
    view = PartitionView(r.root, r.topic, r.partition)
    hint = SegmentPosition(r.segment, r.position) if r.segment >= 0 and start == r.start else None
    stop_at = SegmentPosition(r.stop_segment, r.stop_position) if r.stop_segment >= 0 else None
    try:
        for _ in view.scan(start, r.end, builder.sink, decoder, hint, stop_at=stop_at):
            yield from builder.take()
            if builder.done:
                return
    except DataLossError:
        restart = max(start, builder.next_offset)
        moved = _moved_to_remote(r, restart)
        if moved is not None:
            # Local retention dropped the segments since the range was planned, after their
            # copy to the remote tier: read them from there, the rest locally, into the same
            # builder (the caller filters and selects each batch once; a start timestamp
            # already found stays found).
            yield from _batches(moved, builder)
            return
        if r.fail_on_data_loss:
            raise
        # The records are gone: read what is left of the range, if anything.
        restart = max(restart, view.log_start_offset())
        if restart < r.end and restart > start:
            yield from _batches(replace(r, start=restart, segment=-1, position=0), builder)
            return
    yield from builder.take()


def _moved_to_remote(r: OffsetRange, start: int) -> OffsetRange | None:
    """The rest of ``r`` from ``start``, planned again with its remote part, when the remote
    tier now holds ``start`` below the local segments; None when it does not."""
    store = StoreView(r.root, remote_storage=r.remote_storage, remote_storage_options=dict(r.remote_options))
    view = store.partition(r.topic, r.partition)
    if view.remote is None or not view.remote.segments_in(start, start + 1):
        return None
    local = view.local_log_start_offset()
    if start >= local:
        return None
    return replace(r, start=start, segment=-1, position=0, local_from=local,
                   remote_segments=tuple(view.remote.segments_in(start, min(r.end, local))),
                   remote_storage=view.remote.url, remote_options=tuple(sorted(view.remote.options.items())))
