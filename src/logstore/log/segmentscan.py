"""The one walk over a segment's batches: which are valid, where each starts, why the walk stops.

A segment's bytes are valid iff they are a sequence of valid batches (header sanity, CRC32C,
well-formed records) whose offsets increase and whose last offsets lie within
``[base_offset, base_offset + INT32_MAX]``. The C scan (``ls_segment_scan``) decides it over a
whole range in one call, with no Python per batch. An all-zero tail is the unwritten part of a
preallocated or mapped segment: it ends the data and is no corruption.

:class:`BatchWalk` is that walk over a buffer. :meth:`BatchWalk.scan` runs the C scan (a
segment's recovery, index rebuild and facts take its summary, and have it write the indexes on
the way); iterating the walk gives each valid batch's position and header (the read-only views,
the tools, the check of a Kafka ``__consumer_offsets``), parsed by :func:`~logstore.records.batch.batch_headers`
over the valid prefix the scan found; :attr:`BatchWalk.stop` says where the valid batches end
and why. Every reader that asks "which batches of this segment are valid" asks this walk, so
they all agree with what recovery would keep.

Pure: a walk reads the bytes it is given and knows no segment, file or index object beyond the
index memory it may be handed to fill. Thread-safety: a walk is used by one thread; distinct
walks share nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from .._native import ffi, lib, reason
from ..errors import CorruptRecordError
from ..records.batch import BatchHeader, batch_headers, validate_batch

if TYPE_CHECKING:
    from ..index import OffsetIndex, TimeIndex

__all__ = ["BatchWalk", "WalkStop", "RecoveryResult", "status_words"]

_MAX_RELATIVE_OFFSET = 2**31 - 1


def status_words(status: int) -> str:
    """The reason an ``LS_ERR_*`` scan or validation status gives ("ok" for a success)."""
    return reason(status) if status < 0 else "ok"


@dataclass
class RecoveryResult:
    """What recovering one segment found."""

    valid_bytes: int
    truncated_bytes: int
    status: int
    last_offset: int
    records: int
    #: transaction markers in the valid part (the Log rebuilds the segment's transaction
    #: index when there are any)
    txn_markers: int = 0


@dataclass(frozen=True)
class WalkStop:
    """Where a walk's valid batches end, and why.

    ``status`` is LS_OK when they fill the range, LS_ERR_ZERO when only zero bytes follow them,
    else the error of the batch at ``position``; ``reason`` says it in words, and a CRC mismatch
    carries both CRCs. ``crc_valid`` tells a batch that is whole with a matching CRC yet breaks
    a rule (its records, or its offsets against the segment's) from a torn or garbled write: a
    crash during an append leaves the latter, never the former.
    """

    position: int
    status: int
    reason: str
    crc_valid: bool = False
    stored_crc: int | None = None
    computed_crc: int | None = None


class BatchWalk:
    """The valid batches of ``buf[start:end]``, bytes of a segment whose base offset is
    ``base_offset``.

    >>> from logstore.records.batch import BatchBuilder
    >>> batch = BatchBuilder().build([b"a", b"b"], base_offset=7)
    >>> walk = BatchWalk(batch + bytes(100), base_offset=7)
    >>> [(position, header.last_offset) for position, header in walk]
    [(0, 8)]
    >>> walk.stop.position == len(batch), walk.stop.reason
    (True, 'zero-filled tail')

    The C scan runs once, at the first :meth:`scan`, iteration or :attr:`stop`. No batch size
    limit applies: max_message_bytes governs appends, and lowering it must never make recovery
    cut off batches that were valid when written (Kafka agrees). Not thread-safe.
    """

    def __init__(self, buf: Any, base_offset: int, start: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.base_offset = base_offset
        self.start = start
        self.end = len(buf) if end is None else end
        self._result: Any = None

    def scan(self, index_interval_bytes: int = 0, offset_index: OffsetIndex | None = None,
             time_index: TimeIndex | None = None) -> Any:
        """Run the C scan over the range and return its ``ls_scan_result`` (valid bytes,
        batches, records, last offset, max timestamp and its offset, the status).

        Given both indexes (their memory made writable and reserved by the caller, and the walk
        starting at position 0), the scan writes their entries as appends would have, one per
        ``index_interval_bytes`` of batches.
        """
        if offset_index is not None and self.start:
            raise ValueError("index entries are positions from 0: a walk that writes them starts there")
        res = ffi.new("ls_scan_result *")
        length = self.end - self.start
        if length <= 0:
            res.last_offset = res.max_timestamp = res.offset_of_max_timestamp = -1
            res.status = lib.LS_OK
        else:
            ptr = ffi.from_buffer(self.buf)
            try:
                if offset_index is None or time_index is None:
                    lib.ls_segment_scan(ptr + self.start, length, self.base_offset, index_interval_bytes,
                                        0, ffi.NULL, 0, ffi.NULL, 0, res)
                else:
                    lib.ls_segment_scan(ptr, length, self.base_offset, index_interval_bytes, 0,
                                        offset_index.pointer, offset_index.capacity,
                                        time_index.pointer, time_index.capacity, res)
            finally:
                ffi.release(ptr)
        self._result = res
        return res

    def _scanned(self) -> Any:
        return self._result if self._result is not None else self.scan()

    def __iter__(self) -> Iterator[tuple[int, BatchHeader]]:
        """(position in ``buf``, header) of each valid batch, in order."""
        return batch_headers(self.buf, self.start, self.start + self._scanned().valid_bytes)

    @property
    def stop(self) -> WalkStop:
        """Where the valid batches end and why (see :class:`WalkStop`)."""
        res = self._scanned()
        position = self.start + res.valid_bytes
        header = None
        if res.status not in (lib.LS_OK, lib.LS_ERR_ZERO):
            with memoryview(self.buf) as view, view[: self.end] as within:
                try:
                    header = validate_batch(within, position)  # the batch alone: header and CRC
                except CorruptRecordError:
                    pass
        crc = res.status == lib.LS_ERR_CRC
        return WalkStop(position, res.status, self._why(res, header), header is not None,
                        res.stored_crc if crc else None, res.computed_crc if crc else None)

    def _why(self, res: Any, header: BatchHeader | None) -> str:
        """The words for the scan's status; a batch whole with a matching CRC (``header``) that
        breaks an offset rule of the segment is named with that rule."""
        if header is None or res.status != lib.LS_ERR_CORRUPT:
            return status_words(res.status)
        if header.base_offset <= res.last_offset:
            return (f"offsets go backwards: batch {header.base_offset}..{header.last_offset} after "
                    f"{res.last_offset}")
        if header.last_offset < self.base_offset:
            return (f"batch {header.base_offset}..{header.last_offset} lies below the segment's base offset "
                    f"{self.base_offset}")
        if header.last_offset - self.base_offset > _MAX_RELATIVE_OFFSET:
            return (f"batch {header.base_offset}..{header.last_offset} lies beyond the segment's base offset "
                    f"{self.base_offset} + {_MAX_RELATIVE_OFFSET}")
        return status_words(res.status)
