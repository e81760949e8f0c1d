"""What a Log's Arrow reads need beside the log: pyarrow, imported on first use, the thread that decodes
a second chunk at once, and the table of record batches.

:meth:`Log.iter_arrow <logstore.log.log.Log.iter_arrow>` holds the log's lock for one or two
decoder chunks at a time (about 32,768 rows each); with more than one core the second chunk is
decoded by a :class:`DecodeThread` (the C work releases the GIL). pyarrow is imported only when a
caller asks for Arrow (it is optional).

Thread-safety: a DecodeThread works on the decoder and sink it was given, which nothing else
touches until :meth:`DecodeThread.result` returns.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple, Sequence

from .segments import ColumnsFrom, decode_columns_from
from ..records.batch import RecordDecoder

__all__ = ["arrow_module", "ArrowRead", "DecodeThread", "table"]


def arrow_module() -> Any:
    """logstore.records.arrow, which needs pyarrow (an optional dependency)."""
    try:
        from ..records import arrow as arrowread
    except ImportError as exc:
        raise ImportError(f"reading records as Arrow needs pyarrow: pip install 'logstore[arrow]' ({exc})") from exc
    return arrowread


class ArrowRead(NamedTuple):
    """What one ``iter_arrow`` call builds: the module (logstore.records.arrow), the columns
    (checked) and whether keys and values are views (see ``Log.iter_arrow``)."""

    module: Any
    columns: Sequence[str]
    views: bool

    def builder(self, log: Any, start: int, end: int, max_records: int | None = None,
                decoder: RecordDecoder | None = None) -> Any:
        """An ArrowBuilder of ``log``'s rows [start, end) for this read, fed by ``decoder``
        (with views, the builder takes the columns the decoder wrote)."""
        return self.module.ArrowBuilder(log.topic, log.partition, start, end, self.columns, max_records,
                                        views=self.views, decoder=decoder)


class DecodeThread(threading.Thread):
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


def table(batches: list[Any], columns: Sequence[str] | None, views: bool = False) -> Any:
    """Record batches as one ``pyarrow.Table`` of the columns' schema (empty when none; key and
    value ``binary_view`` with ``views``)."""
    arrowread = arrow_module()
    return arrowread.pa.Table.from_batches(batches, schema=arrowread.schema(columns, views))
