"""Making and keeping a segment active: its C appender, its writable map and growth, shared views.

The active (last) segment is written through a shared memory map of its ``.log``: the C
appender (``ls_appender``) copies each batch into the map and updates the mapped indexes. The
functions here build the appender when a segment becomes active (from the segment's facts, or
from a view published by another process in multi-process mode), map the file writable and grow
the map, and keep the appender and a shared view in step. Each takes the
:class:`~logstore.segment.LogSegment` and sets its private state; segment.py calls them, and
segmentrecovery.py reserves index room through :func:`reserve_index_room`. The append itself
stays in LogSegment.append_batch (the hot path). Not thread-safe, as LogSegment.
"""

from __future__ import annotations

import errno
import logging
import mmap
from typing import TYPE_CHECKING, Any

from .. import _fileio
from .._native import ffi, lib

if TYPE_CHECKING:  # annotations only: segment.py imports this module
    from ..segment import LogSegment

__all__ = ["activate", "activate_shared", "adopt", "deactivate", "grow", "map_writable", "reserve_index_room"]

logger = logging.getLogger("logstore.segment")

_GROWTH_STEP = 8 << 20  # first map of a non-preallocated active segment; doubles after


# ---------------------------------------------------------------------- the writable map
def map_writable(segment: LogSegment, capacity: int, reserve_indexes: bool = True) -> None:
    """Map ``capacity`` bytes of the .log writable, its blocks (and the index room) reserved first."""
    # Reserve the blocks first: if the disk is full this fails while the old map is valid.
    # The first store into a page allocates every block of the page that lies inside the file
    # (a block can be smaller than a page), and the file may be longer than the map (a segment
    # file from an earlier life): reserve to the end of the last page, within the file.
    in_page = -(-capacity // mmap.PAGESIZE) * mmap.PAGESIZE
    if in_page > capacity:
        in_page = max(capacity, min(in_page, _fileio.ops.fsize(segment._fd)))
    _fileio.ops.fallocate(segment._fd, in_page)
    if reserve_indexes:
        reserve_index_room(segment, capacity)
    written = segment._size if segment._appender is None else segment._appender.position
    segment._unmap()
    segment._mm = _fileio.ops.mmap(segment._fd, capacity, True)
    # Fault the unwritten pages in ahead: first-touch stores into fresh pages of a shared
    # map cost a page fault each (measured: 0.7 GB/s for plain stores, 2.4-2.8 GB/s after
    # WILLNEED). Only the part past the data: advising the whole map again at every growth
    # step made appends slower as the segment grew.
    start = written - written % mmap.PAGESIZE
    try:
        segment._mm.madvise(mmap.MADV_WILLNEED, start, capacity - start)
    except (AttributeError, OSError, ValueError):  # pragma: no cover - not on every platform
        pass
    segment._ptr = ffi.from_buffer(segment._mm)


def reserve_index_room(segment: LogSegment, log_bytes: int) -> None:
    """Allocate index blocks for every entry ``log_bytes`` of batches can produce (one per
    index_interval_bytes), so that no index store hits an unallocated page (see
    OffsetIndex.reserve)."""
    entries = log_bytes // max(segment.index_interval_bytes, 1) + 2
    segment.offset_index.reserve(entries)
    segment.time_index.reserve(entries)


def _initial_capacity(segment: LogSegment, needed: int) -> int:
    if segment.preallocate:
        return max(segment.segment_bytes, needed)
    capacity = min(segment.segment_bytes, _GROWTH_STEP)
    while capacity < needed:
        capacity *= 2
    return max(capacity, needed, 4096)


def grow(segment: LogSegment, needed: int) -> bool:
    """Make room for a batch of ``needed`` bytes; False when the segment must roll instead.

    Invariant: the appender's log_capacity never exceeds segment_bytes, except for an
    empty segment taking one batch larger than that (which then sits alone in it).
    """
    a = segment._appender
    if segment.offset_index.capacity <= a.index_entries or segment.time_index.capacity <= a.timeindex_entries:
        return False
    end = a.position + needed
    if a.position > 0 and end > segment.segment_bytes:
        return False
    if end <= a.log_capacity:
        return False  # FULL for another reason (offset range): roll
    map_len = len(segment._mm)  # type: ignore[arg-type]
    if end > map_len:
        map_writable(segment, max(min(map_len * 2, segment.segment_bytes), end))
        a.log = segment._ptr
    a.log_capacity = max(min(len(segment._mm), segment.segment_bytes), end)  # type: ignore[arg-type]
    return True


# ---------------------------------------------------------------------- activation
def _new_appender(segment: LogSegment) -> Any:
    """An appender over the segment's current map and indexes, with its fixed settings."""
    a = ffi.new("ls_appender *")
    a.log = segment._ptr
    a.base_offset = segment.base_offset
    a.index = segment.offset_index.pointer
    a.index_capacity = segment.offset_index.capacity
    a.timeindex = segment.time_index.pointer
    a.timeindex_capacity = segment.time_index.capacity
    a.index_interval_bytes = segment.index_interval_bytes
    a.max_batch_bytes = segment.max_batch_bytes
    return a


def activate(segment: LogSegment) -> None:
    """LogSegment.activate: map writable after the data and take the appender's state from the
    segment's facts."""
    valid_bytes = segment._size
    next_offset = segment.next_offset
    max_ts, offset_of_max = segment._max_timestamp_and_offset()
    records_before = segment._records
    segment.offset_index.make_writable()
    segment.time_index.make_writable()
    try:
        map_writable(segment, _initial_capacity(segment, valid_bytes))
    except OSError as exc:
        existing = _fileio.ops.fsize(segment._fd)
        if exc.errno != errno.ENOSPC or existing < max(valid_bytes, 1):
            raise
        # A full disk: map only the blocks the file already has, so the log still opens and
        # reads; the first append that needs more room fails with ENOSPC (and takes the log
        # offline) instead of the open.
        logger.warning("%s: no space to reserve room for appends; opening with %d bytes", segment.path, existing)
        # The bytes there have their index entries already; the first append needs more
        # room, and growing reserves the index room with it (or fails with ENOSPC).
        map_writable(segment, existing, reserve_indexes=False)
    a = _new_appender(segment)
    a.log_capacity = min(len(segment._mm), max(segment.segment_bytes, valid_bytes))  # type: ignore[arg-type]
    a.position = valid_bytes
    a.next_offset = next_offset
    a.index_entries = segment.offset_index.entries
    a.timeindex_entries = segment.time_index.entries
    a.bytes_since_last_entry = 0
    a.max_timestamp = max_ts
    a.offset_of_max_timestamp = offset_of_max
    a.last_timeindex_timestamp = segment.time_index.last_entry()[0] if segment.time_index.entries else -1
    a.partition_leader_epoch = segment._leader_epoch
    a.records = 0
    # Records already present are counted lazily (a full scan) only if someone asks.
    segment._records_at_activation = records_before
    segment._size_at_activation = valid_bytes
    segment._appender = a


# ---------------------------------------------------------------------- shared (multi-process) mode
def activate_shared(segment: LogSegment, view: Any) -> None:
    """LogSegment.activate_shared: the appender's state comes from ``view``, with no scan."""
    segment.offset_index.make_writable()
    segment.time_index.make_writable()
    segment._size = view.position
    map_writable(segment, max(_fileio.ops.fsize(segment._fd), _initial_capacity(segment, view.position)))
    segment._appender = _new_appender(segment)
    segment._records_at_activation = None
    segment._size_at_activation = 0
    adopt(segment, view)


def adopt(segment: LogSegment, view: Any) -> None:
    """LogSegment.adopt: take the appender's state from ``view``, remapping when another process
    grew the file past this process's map."""
    a = segment._appender
    if view.position > len(segment._mm):  # type: ignore[arg-type]
        map_writable(segment, max(_fileio.ops.fsize(segment._fd), view.position))
        a.log = segment._ptr
    a.log_capacity = min(len(segment._mm), max(segment.segment_bytes, view.position))  # type: ignore[arg-type]
    lib.ls_appender_adopt(a, view)
    segment._records_at_activation = 0  # view.records counts the whole segment
    segment.offset_index.entries = view.index_entries
    segment.time_index.entries = view.timeindex_entries


def deactivate(segment: LogSegment) -> None:
    """LogSegment.deactivate: another process sealed the segment; drop the appender and map the
    files read-only as they are now (the facts are learnt again on demand)."""
    if segment._appender is None:
        return
    segment._appender = None
    segment._unmap()
    segment._size = _fileio.ops.fsize(segment._fd)
    segment._next_offset = None
    segment._records = None
    segment._max_timestamp = None
    segment.offset_index.reload_sealed()
    segment.time_index.reload_sealed()
