"""Reads of one record by offset: the log's reader (PointLog), a segment's memo and C state.

A read of one record (``Log.read(offset, max_records=1)``) through the general path costs a
dozen Python calls around the C decoder. The short path is one call into the ``_records``
extension instead (pypoint.c): :class:`PointLog`, kept by the log's :class:`LogSegments` until
the set of segments changes, finds the segment by base offset, looks the offset up in the
segment's offset index, checks the entry against its batch, decodes the one record (the core's
``ls_point_read``, a partial ``ls_segment_decode``) and builds its Record. Anything out of the
ordinary (an entry that does not match, a compressed or invalid batch, no record at or after the
offset in the segment, an offset not an int at or above the log start) returns None, and the
caller takes the general read, which reports it. What PointLog knows of a segment comes from
``LogSegment.point_entry`` and is asked again whenever the map it was given has been closed (a
remap at growth, sealing, truncation): it never reads through a map that is gone.

:class:`PointReads` is what a segment keeps for these reads. Its memo (``ls_crc_memo``, 4-way
set associative) is made on a segment's first point read with a slot per 32 KiB of the segment
(of ``segment_bytes`` for the active one), 16 to 1,024 slots (8 KiB-512 KiB: at most 1.6% of a
small segment, 0.05% of a 1 GiB one). It remembers batches validated whole, by position and
stored CRC, with the positions of 128 records in each: a later read of a record in such a batch
skips its CRC and walks from the nearest of them (a 1,000-record batch: about 3.5 records on
average; 8 with 64 marks, 1.5 with 256, whose C part of a warm read is 7% faster for twice the
memory, which every sequential ``read(max_records=...)`` fills too). It also notes (``nexts``)
that the header of the batch after a remembered one was found above it: later reads of the batch
skip that header (a page of the segment fewer per read) while the batch's last offset is still
the one checked (its baseOffset lies outside the CRC). Both paths of the segment
share it. It lives while the log is open and is dropped when the segment is
truncated (a rewritten batch carries another CRC and would be validated again all the same).

Not thread-safe: the Log's lock serialises the reads of a segment.
"""

from __future__ import annotations

from typing import Any

from .._native import ffi, lib
from .._native._records import PointLog
from .._native._records import configure as _configure
from .._native._records import point as _point
from .._native._records import point_active as _point_active
from ..records.batch import NO_HEADERS, TIMESTAMP_TYPES, Record, decode_headers

__all__ = ["PointLog", "PointReads", "read_point", "read_point_active"]

MEMO_SLOTS = 1024  # at most, batches remembered as validated (a power of two)
MEMO_MIN_SLOTS = 16
MEMO_BYTES_PER_SLOT = 32 << 10  # a slot per 32 KiB of the segment when the memo is made
MEMO_MARKS = 128   # record positions remembered per batch (512 bytes a slot)
_ROW_ARRAYS = (("offsets", "int64_t[]"), ("timestamps", "int64_t[]"), ("timestamp_types", "int8_t[]"),
               ("key_pos", "int32_t[]"), ("key_len", "int32_t[]"), ("value_pos", "int32_t[]"),
               ("value_len", "int32_t[]"), ("headers_pos", "int32_t[]"), ("headers_len", "int32_t[]"),
               ("header_count", "int32_t[]"))

_configure(Record, TIMESTAMP_TYPES, NO_HEADERS, decode_headers,
           int(ffi.cast("uintptr_t", ffi.addressof(lib, "ls_point_read"))))

#: read_point(buf, size, index, entries, base_offset, offset, max_offset, address) -> Record | None
read_point = _point
#: read_point_active(appender_address, address, offset, max_offset, buf) -> Record | None: the
#: active segment's bytes and index as its ls_appender describes them at the call
read_point_active = _point_active


class PointReads:
    """A segment's state for reads of one record: the memo (``memo``, an ``ls_crc_memo *``)
    and the ``ls_point`` at ``address`` that :func:`read_point` takes; for the active segment,
    the appender it was last bound to (:meth:`bind`) and that appender's address."""

    __slots__ = ("memo", "address", "appender", "appender_address", "_keep")

    def __init__(self, max_batch_bytes: int, segment_size: int = 0) -> None:
        slots = max(MEMO_MIN_SLOTS, min(MEMO_SLOTS, 1 << max(0, (segment_size // MEMO_BYTES_PER_SLOT) - 1).bit_length()))
        memo = ffi.new("ls_crc_memo *")
        arrays = [ffi.new("int64_t[]", slots), ffi.new("uint32_t[]", slots), ffi.new("int32_t[]", slots * MEMO_MARKS),
                  ffi.new("int64_t[]", slots)]
        memo.positions, memo.crcs, memo.marks, memo.nexts = arrays
        memo.slots, memo.nmarks = slots, MEMO_MARKS
        state = ffi.new("ls_point *")
        state.memo = memo
        state.max_batch_bytes = max_batch_bytes
        state.out.capacity = 1
        for field, ctype in _ROW_ARRAYS:
            row = ffi.new(ctype, 1)
            setattr(state.out, field, row)
            arrays.append(row)
        self.memo: Any = memo
        self.address = int(ffi.cast("uintptr_t", state))
        self._keep = (state, arrays)  # the C structs point into these
        self.appender: Any = None
        self.appender_address = 0

    def bind(self, appender: Any) -> None:
        """Read the active segment through ``appender`` (an ``ls_appender *``, kept alive
        here while bound)."""
        self.appender = appender
        self.appender_address = int(ffi.cast("uintptr_t", appender))
