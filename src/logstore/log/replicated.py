"""A Log's replication primitives: leader epochs, raw reads for followers, a follower's copy of its leader's batches.

A leader stamps its epoch into every batch it appends (:func:`assign_leader_epoch` records where
the epoch starts in ``leader-epoch-checkpoint``) and answers Kafka's OffsetsForLeaderEpoch from
that history (:func:`end_offset_for_epoch`). A follower fetches whole batches byte for byte
(:func:`read_raw`) and appends them as they are (:func:`append_replicated`): offsets, timestamps
and partitionLeaderEpoch kept, every new epoch learnt, the producer state taught each batch
(as Kafka's replication origin: remembered, never checked), and the log end jumping over the gaps
a compacted leader has.

Each function implements the :class:`~logstore.log.log.Log` method of its name, as a function of
the log: it reads and sets the log's offsets, active segment and epoch cache.

Thread-safety: every public function takes the log's lock (and for a change its writers' lock),
as the Log's methods say.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from .. import _fileio
from .._fileio import FileRegion
from .._native import check, ffi, lib
from ..records.batching import check_offset
from ..errors import OffsetOutOfRangeError
from .appends import CLOSED_APPENDER, make_room, roll_segment

__all__ = ["assign_leader_epoch", "latest_epoch", "end_offset_for_epoch", "read_raw", "append_replicated"]


def assign_leader_epoch(log: Any, epoch: int) -> None:
    """Log.assign_leader_epoch: record (epoch, log end) and stamp ``epoch`` into new batches."""
    with log._lock, log._w:
        log._check_open()
        cache = log.leader_epochs
        assert cache is not None
        if epoch < cache.latest_epoch:
            raise ValueError(f"{log.path}: leader epoch {epoch} is older than the log's latest "
                             f"epoch {cache.latest_epoch}")
        cache.assign(epoch, log._appender.next_offset)
        log._appender.partition_leader_epoch = epoch


def latest_epoch(log: Any) -> int:
    """Log.latest_epoch: the newest leader epoch in the log's history, -1 when none."""
    with log._lock:
        log._check_open()
        assert log.leader_epochs is not None
        return log.leader_epochs.latest_epoch


def end_offset_for_epoch(log: Any, epoch: int) -> tuple[int, int]:
    """Log.end_offset_for_epoch: (epoch, end offset) as OffsetsForLeaderEpoch answers it."""
    with log._lock:
        log._check_open()
        log._follow()
        assert log.leader_epochs is not None
        return log.leader_epochs.end_offset_for(epoch, log._appender.next_offset)


def read_raw(log: Any, offset: int, max_bytes: int) -> bytes:
    """Log.read_raw: whole batches as stored, from the one holding ``offset`` on."""
    with _reading(log, offset, "read_raw") as start:
        return log._segments.read_raw(start, max_bytes)  # type: ignore[no-any-return]


def read_region(log: Any, offset: int, max_bytes: int, max_offset: int | None = None) -> FileRegion | None:
    """Log.read_region: read_raw's batches as a region of the segment file (None past the end),
    without the batches at or above ``max_offset`` (a batch boundary: a high watermark)."""
    with _reading(log, offset, "read_region") as start:
        segment, position, length = log._segments.locate_raw(start, max_bytes)
        if segment is None:
            return None
        if max_offset is not None and max_offset < log._appender.next_offset:
            length = _cut_at(segment.fd, position, length, max_offset)
            if not length:
                return None
        # A descriptor of its own: the segment may be closed, rolled or deleted before the
        # region is written (its pages stay readable through it).
        return FileRegion(_fileio.ops.dup(segment.fd), position, length)


def _cut_at(fd: int, position: int, length: int, max_offset: int) -> int:
    """The bytes of the region's whole batches below ``max_offset`` (their headers read again:
    the region's batches were checked whole, so each header is sound)."""
    cut = 0
    while cut + 12 <= length:
        head = _fileio.ops.pread(fd, min(27, length - cut), position + cut)
        if len(head) < 12:
            break
        last = int.from_bytes(head[:8], "big")  # a legacy message's own (or its wrapper's last) offset
        if len(head) == 27 and head[16] == 2:  # magic 2: the base offset plus the last offset delta
            last += int.from_bytes(head[23:27], "big")
        if last >= max_offset:  # a batch that reaches max_offset is not taken
            break
        cut += 12 + int.from_bytes(head[8:12], "big")
    return min(cut, length)


@contextmanager
def _reading(log: Any, offset: int, what: str) -> Iterator[int]:
    """Hold the log's lock for a raw read at ``offset`` (checked: within [log start, log end])."""
    offset = check_offset(offset)
    with log._lock:
        log._check_open()
        log._follow()
        end = log._appender.next_offset
        if offset < log._log_start_offset or offset > end:
            raise OffsetOutOfRangeError(offset, log._log_start_offset, end, f"{what} from {log.path}")
        yield offset


def append_replicated(log: Any, data: bytes | bytearray | memoryview) -> int:
    """Log.append_replicated: append a leader's batches as they are; return the new log end.
    Afterwards this log's appends stamp the newer of its own epoch and the latest one learnt."""
    view = memoryview(data).cast("B")
    with log._lock, log._w:
        log._check_open()
        cache = log.leader_epochs
        assert cache is not None
        own_epoch = log._appender.partition_leader_epoch
        try:
            with log._io_guard():
                _copy_batches(log, view, cache)
        finally:
            if log._appender is not CLOSED_APPENDER:
                log._appender.partition_leader_epoch = max(own_epoch, cache.latest_epoch)
        last = log._appender.next_offset
    if last - 1 >= log._flush_at:
        log._after_append(last - 1)
    return last


def _copy_batches(log: Any, view: memoryview, cache: Any) -> None:
    """Append the batches in ``view`` as a leader stored them, teaching ``cache`` every new
    epoch. Each batch is validated first; the valid batches before an invalid one stay appended.

    Raises:
        CorruptRecordError: a batch is invalid.
        OffsetOutOfRangeError: a batch starts below the log end.
    """
    n = len(view)
    hdr = ffi.new("ls_batch_header *")
    crc = ffi.new("uint32_t *")
    limit = log.config.max_message_bytes
    position = 0
    while position < n:
        chunk = view[position:]
        size = lib.ls_batch_validate(ffi.from_buffer(chunk), n - position, limit, hdr, crc)
        if size < 0:
            check(size, "<replicated data>", position, stored_crc=hdr.crc, computed_crc=crc[0],
                  size=hdr.batch_length + lib.LS_LOG_OVERHEAD, limit=limit)
        end = log._appender.next_offset
        if hdr.base_offset < end:
            raise OffsetOutOfRangeError(hdr.base_offset, log._log_start_offset, end,
                                        f"replicated batch for {log.path} overlaps the log")
        epoch = hdr.partition_leader_epoch
        if epoch > cache.latest_epoch:
            cache.assign(epoch, hdr.base_offset)
        if hdr.base_offset > end:
            _skip_to(log, hdr.base_offset, hdr.last_offset_delta)
        log._appender.partition_leader_epoch = epoch
        batch = bytes(chunk[:size])
        offset = log._active.append_batch(batch)
        if offset == lib.LS_ERR_FULL:
            make_room(log, size)
            log._appender.partition_leader_epoch = epoch
            offset = log._active.append_batch(batch)
        if offset < 0:
            check(offset, log._active.path, size=size, limit=limit)
        if hdr.producer_id >= 0:
            log._producers.learn(hdr.producer_id, hdr, offset)  # learnt as it is, never checked
        position += size


def _skip_to(log: Any, base: int, last_offset_delta: int) -> None:
    """A replicated batch at ``base`` after a gap (a compacted leader): the log end jumps
    there. Offsets of one segment must stay within 2^31 of its base, so a non-empty active
    segment rolls when the batch would not fit, and an empty one is replaced."""
    active = log._segments.active
    assert active is not None
    if active.size > 0 and base - active.base_offset > 2**31 - 1 - last_offset_delta:
        roll_segment(log)
        active = log._segments.active
        assert active is not None
    if active.size == 0 and active.base_offset != base:
        log._set_active(log._segments.replace_empty_active(base, log._appender.partition_leader_epoch))
        if len(log._segments) == 1:  # the log was empty: it now starts at base
            log._log_start_offset = base
            log._recovery_point = max(log._recovery_point, base)
            log._flushed_offset = max(log._flushed_offset, base)
    else:
        log._appender.next_offset = base
