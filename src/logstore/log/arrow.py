"""A Log's records as Arrow record batches: Log.iter_arrow and Log.read_arrow.

The log's lock is held for one or two decoder chunks at a time (about 32,768 rows each): the
chunk's batches are located through the offset index, decoded by C straight from the mapped
segment and turned into an Arrow record batch by :class:`~logstore.records.arrow.ArrowBuilder`;
appends, rolls and retention go on between chunks. Without ``max_records`` and with more than
one core, chunks go in pairs, the second decoded by a helper thread (the C work releases the
GIL). pyarrow is imported only here, when a caller asks for Arrow.

Thread-safety: each call has its own decoder and builder; the log's state is read under its lock.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Iterator, Sequence

from ..records.batching import check_offset
from ..errors import OffsetOutOfRangeError
from .segments import ColumnsFrom, decode_columns_from
from ..records.batch import RecordDecoder

__all__ = ["iter_arrow", "read_arrow", "table"]


def _arrowread() -> Any:
    """logstore.records.arrow, which needs pyarrow (an optional dependency)."""
    try:
        from ..records import arrow as arrowread
    except ImportError as exc:
        raise ImportError(f"reading records as Arrow needs pyarrow: pip install 'logstore[arrow]' ({exc})") from exc
    return arrowread


def iter_arrow(log: Any, start: int | None, end: int | None, columns: Sequence[str] | None,
               max_records: int | None) -> Iterator[Any]:
    """Log.iter_arrow (the range is checked now, the records read as the caller iterates)."""
    arrowread = _arrowread()
    columns = arrowread.check_columns(columns)
    if max_records is not None and max_records < 0:
        raise ValueError(f"max_records must be >= 0, not {max_records}")
    with log._lock:
        log._check_open()
        log._follow()
        log_end = log._appender.next_offset
        offset = log._log_start_offset if start is None else check_offset(start)
        if offset < log._log_start_offset or offset > log_end:
            raise OffsetOutOfRangeError(offset, log._log_start_offset, log_end, f"read_arrow from {log.path}")
        stop = log_end if end is None else min(check_offset(end), log_end)
    return _batches(log, arrowread, offset, stop, columns, max_records)


def _batches(log: Any, arrowread: Any, offset: int, stop: int, columns: Sequence[str],
             max_records: int | None) -> Iterator[Any]:
    if max_records is None and (os.cpu_count() or 1) > 1:
        yield from _batches_in_pairs(log, arrowread, offset, stop, columns)
        return
    builder = arrowread.ArrowBuilder(log.topic, log.partition, offset, stop, columns, max_records)
    decoder = RecordDecoder(capacity=arrowread.ROWS_PER_BATCH)
    while offset < stop and not builder.done:
        with log._lock:
            _check_readable(log, offset)
            limit = min(stop, offset + arrowread.ROWS_PER_BATCH)
            offset = max(log._segments.decode_columns(decoder, offset, limit, builder.sink), builder.next_offset)
        yield from builder.take()


def _check_readable(log: Any, offset: int) -> None:
    """Under the log's lock: the log is open and ``offset`` is not below its start."""
    log._check_open()
    log._follow()
    if offset < log._log_start_offset:
        raise OffsetOutOfRangeError(offset, log._log_start_offset, log._appender.next_offset,
                                    f"read_arrow from {log.path} (the log start moved past it)")


def _batches_in_pairs(log: Any, arrowread: Any, offset: int, stop: int, columns: Sequence[str]) -> Iterator[Any]:
    """Two chunks at a time on two cores: while this thread decodes ``[offset, mid)``, a
    helper thread decodes from ``mid`` on in the segment holding it (located here first), and
    the log's lock is held until both are done, so nothing moves under either. The C decode and
    the gathering of keys and values release the GIL. Chunk A's builder stops at ``mid``; B's
    takes a batch straddling its limit whole, as the single-chunk loop does."""
    rows = arrowread.ROWS_PER_BATCH
    decoders = (RecordDecoder(capacity=rows), RecordDecoder(capacity=rows))
    while offset < stop:
        with log._lock:
            _check_readable(log, offset)
            mid = min(stop, offset + rows)
            first = arrowread.ArrowBuilder(log.topic, log.partition, offset, mid, columns)
            second, helper = None, None
            # Both starts are located before the helper runs: a lookup that finds a damaged
            # index entry rebuilds that segment's indexes, which unmaps its log for a moment,
            # so it must not happen while the helper reads the segment.
            log._segments.columns_from(offset)
            at = log._segments.columns_from(mid) if mid < stop else None
            if at is not None:
                second = arrowread.ArrowBuilder(log.topic, log.partition, mid, stop, columns)
                helper = _Helper(decoders[1], at, mid, min(stop, mid + rows), second.sink)
            try:
                while offset < mid and not first.done:
                    offset = max(log._segments.decode_columns(decoders[0], offset, mid, first.sink), first.next_offset)
            finally:
                after = helper.result() if helper is not None else None
            offset = mid if after is None else max(after, second.next_offset)  # type: ignore[union-attr]
        yield from first.take()
        if second is not None:
            yield from second.take()


class _Helper(threading.Thread):
    """decode_columns_from in a thread of its own; :meth:`result` joins it and returns its
    answer or raises its exception."""

    def __init__(self, decoder: RecordDecoder, at: ColumnsFrom, offset: int, limit: int, sink: Any) -> None:
        super().__init__(name="logstore-arrow", daemon=True)
        self._args = (decoder, at, offset, limit, sink)
        self._after: int | None = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._after = decode_columns_from(*self._args)
        except BaseException as exc:  # noqa: BLE001 - handed to the reading thread
            self._error = exc

    def result(self) -> int | None:
        self.join()
        if self._error is not None:
            raise self._error
        return self._after


def read_arrow(log: Any, start: int | None, end: int | None, columns: Sequence[str] | None,
               max_records: int | None) -> Any:
    """Log.read_arrow: iter_arrow's batches as one table."""
    return table(list(iter_arrow(log, start, end, columns, max_records)), columns)


def table(batches: list[Any], columns: Sequence[str] | None) -> Any:
    """Record batches as one ``pyarrow.Table`` of the columns' schema (empty when none)."""
    arrowread = _arrowread()
    return arrowread.pa.Table.from_batches(batches, schema=arrowread.schema(columns))
