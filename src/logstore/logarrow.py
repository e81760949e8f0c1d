"""A Log's records as Arrow record batches: Log.iter_arrow and Log.read_arrow.

The log's lock is held for one decoder chunk at a time (about 32,768 rows): the chunk's batches
are located through the offset index, decoded by C straight from the mapped segment and turned
into an Arrow record batch by :class:`~logstore.arrowread.ArrowBuilder`; appends, rolls and
retention go on between chunks. pyarrow is imported only here, when a caller asks for Arrow.

Thread-safety: each call has its own decoder and builder; the log's state is read under its lock.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from .batching import check_offset
from .errors import OffsetOutOfRangeError
from .records import RecordDecoder

__all__ = ["iter_arrow", "read_arrow", "table"]


def _arrowread() -> Any:
    """logstore.arrowread, which needs pyarrow (an optional dependency)."""
    try:
        from . import arrowread
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
    builder = arrowread.ArrowBuilder(log.topic, log.partition, offset, stop, columns, max_records)
    decoder = RecordDecoder(capacity=arrowread.ROWS_PER_BATCH)
    while offset < stop and not builder.done:
        with log._lock:
            log._check_open()
            log._follow()
            if offset < log._log_start_offset:
                raise OffsetOutOfRangeError(offset, log._log_start_offset, log._appender.next_offset,
                                            f"read_arrow from {log.path} (the log start moved past it)")
            limit = min(stop, offset + arrowread.ROWS_PER_BATCH)
            offset = max(log._segments.decode_columns(decoder, offset, limit, builder.sink), builder.next_offset)
        yield from builder.take()


def read_arrow(log: Any, start: int | None, end: int | None, columns: Sequence[str] | None,
               max_records: int | None) -> Any:
    """Log.read_arrow: iter_arrow's batches as one table."""
    return table(list(iter_arrow(log, start, end, columns, max_records)), columns)


def table(batches: list[Any], columns: Sequence[str] | None) -> Any:
    """Record batches as one ``pyarrow.Table`` of the columns' schema (empty when none)."""
    arrowread = _arrowread()
    return arrowread.pa.Table.from_batches(batches, schema=arrowread.schema(columns))
