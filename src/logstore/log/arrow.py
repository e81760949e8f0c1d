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

import os
import queue
import threading
from typing import Any, NamedTuple, Sequence

from .segments import ColumnsFrom, decode_columns_from
from ..records.batch import RecordDecoder

__all__ = ["arrow_module", "ArrowRead", "DecodeJob", "DecodeHelper", "submit", "table"]


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


class DecodeJob:
    """decode_columns_from of one chunk, run by the :class:`DecodeHelper` thread if it gets to
    it first, else by the reading thread itself when it asks for the :meth:`result` (work
    stealing: a second thread that gets no core never holds the read up). Submitted with
    :func:`submit`.

    Thread-safety: the job runs once, in whichever thread claims it; the decoder and sink it was
    given are touched by nothing else until :meth:`result` returns."""

    __slots__ = ("_args", "_claim", "_done", "_after", "_error")

    def __init__(self, decoder: RecordDecoder, at: ColumnsFrom, offset: int, limit: int, sink: Any) -> None:
        self._args: tuple[Any, ...] | None = (decoder, at, offset, limit, sink)
        self._claim = threading.Lock()
        self._done = threading.Event()
        self._after: int | None = None
        self._error: BaseException | None = None

    def run_if_unclaimed(self) -> None:
        """Run the job here unless another thread has claimed it."""
        claimed = False
        try:  # (a KeyboardInterrupt right after the claim still marks the job done)
            claimed = self._claim.acquire(blocking=False)
            if not claimed:
                return
            args, self._args = self._args, None  # a job left in the helper's queue holds nothing
            self._after = decode_columns_from(*args)  # type: ignore[misc]
        except BaseException as exc:  # noqa: BLE001 - handed to the reading thread
            self._error = exc
            if not claimed:
                raise
        finally:
            if claimed:
                self._done.set()

    def cancel(self) -> None:
        """Drop the job if no thread has started it, else wait until it is done (its outcome
        is not wanted: the read failed)."""
        if self._claim.acquire(blocking=False):
            self._args = None
            self._done.set()
        self._done.wait()

    def result(self) -> int | None:
        """The decode's answer (decode_columns_from's), run here if the helper has not started
        it, else awaited; raises its exception."""
        self.run_if_unclaimed()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._after


class DecodeHelper:
    """The process's one helper thread for Arrow reads: it runs the :class:`DecodeJob` s
    submitted, in order, each unless its reader took it back first. Started at the first
    submission (again in a forked child). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[DecodeJob] = queue.SimpleQueue()
        self._pid = 0
        # A fork while another thread held the lock would leave it held in the child for ever.
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self._lock = threading.Lock()

    def submit(self, job: DecodeJob) -> DecodeJob:
        """Queue ``job`` for the helper thread (started if this process has none yet)."""
        with self._lock:
            if self._pid != os.getpid():  # none yet, or a forked child (threads do not survive fork)
                self._jobs = queue.SimpleQueue()
                threading.Thread(target=self._run, args=(self._jobs,), name="logstore-arrow", daemon=True).start()
                self._pid = os.getpid()
            self._jobs.put(job)
        return job

    @staticmethod
    def _run(jobs: queue.SimpleQueue[DecodeJob]) -> None:
        while True:
            jobs.get().run_if_unclaimed()


_HELPER = DecodeHelper()


def submit(decoder: RecordDecoder, at: ColumnsFrom, offset: int, limit: int, sink: Any) -> DecodeJob:
    """A :class:`DecodeJob` of these arguments, queued for the helper thread."""
    return _HELPER.submit(DecodeJob(decoder, at, offset, limit, sink))


def table(batches: list[Any], columns: Sequence[str] | None, views: bool = False) -> Any:
    """Record batches as one ``pyarrow.Table`` of the columns' schema (empty when none; key and
    value ``binary_view`` with ``views``)."""
    arrowread = arrow_module()
    return arrowread.pa.Table.from_batches(batches, schema=arrowread.schema(columns, views))
