"""The Log's append paths other than the fast one: the general record path, client batches, rolls for time and room.

:class:`~logstore.log.log.Log` keeps the append fast path (one lock, one clock read, one C call into
the active segment's map) and ``append_batch``'s argument checks. The rest lives here, as functions of the log: the settings the append paths take from the config, the general
single-record path (conversions, headers, LogAppendTime, a forced codec), the encoding and
append of ``append_batch``'s records, a client's encoded batch (validated whole, checked against
the producer state of :mod:`~logstore.log.producers` under the same locks as its append, stored
as it is or re-encoded when the log's policy needs other bytes), rolling when a record is past
the segment's time limit (Kafka's segment.ms) and the roll itself, making room when the active
segment reports FULL (grow its map, or roll), explaining a record too large for
max_message_bytes, and appending one encoded batch. A follower's copy of its leader's batches is
in :mod:`~logstore.log.replicated`.

Thread-safety: :func:`append_general` and :func:`append_client_batch` are called without the
log's locks and take them; every other function runs with the log's lock and writers' lock held
(the caller's). They read and set the log's offsets and active segment, as its own methods would.
"""

from __future__ import annotations

import time
from typing import Any

from typing import NamedTuple

from ..records import compression
from .._native import check, ffi, lib
from ..records.batching import as_bytes, check_available, check_timestamp, encode_batches, one_record_batch_size
from ..errors import InvalidRecordError, RecordTooLargeError
from .flusher import NEVER
from .producerstate import increment_sequence
from ..records.batch import decode_batches, encode_headers, parse_header, validate_client_batch

__all__ = ["DEADLINE_UNSET", "CLOSED_APPENDER", "TS_MIN", "TS_MAX", "AppendInfo", "append_settings",
           "keyless_record_error", "append_general", "append_client_batch", "append_records_locked",
           "roll_for_time", "roll_segment", "append_record_slow", "make_room", "append_encoded_locked"]

#: below every timestamp: the next append computes the real roll deadline
DEADLINE_UNSET = -(2**63)
#: Stands in for the appender of a closed log: the C core rejects it (no buffer), and the slow
#: path then raises LogClosedError, so the append fast path needs no closed check.
CLOSED_APPENDER = ffi.new("ls_appender *")
#: the range of an explicit timestamp the append paths take as it is
TS_MIN, TS_MAX = -(2**63), 2**63 - 1
_append_record = lib.ls_appender_append_record
_NULL = ffi.NULL
_time_ns = time.time_ns


class AppendInfo(NamedTuple):
    """What :meth:`Log.append_idempotent <logstore.log.log.Log.append_idempotent>` did with a
    client's batch: the offsets its records have, and whether it was a duplicate (a retry of a
    batch already in the log, which was not appended again: the offsets are that batch's)."""

    first_offset: int
    last_offset: int
    duplicate: bool


def append_settings(config: Any, shared: bool) -> tuple[int, int, int | None, bool, bool]:
    """What the append paths take from ``config``: (timestamp type code, record attributes, the
    codec the log forces or None for the producer's, keys required, plain). Plain appends take
    Log.append's fast path: no codec to apply, CreateTime stamps, keys optional, one process."""
    ts_type = config.timestamp_type_code
    codec = config.compression_type
    forced = None if codec == "producer" else compression.codec_from_name(codec)
    if forced is not None:
        check_available(forced)
    keys_required = config.compacted
    plain = forced in (None, compression.NONE) and not ts_type and not keys_required and not shared
    return ts_type, lib.LS_ATTR_TIMESTAMP_TYPE if ts_type else 0, forced, keys_required, plain


def keyless_record_error(log: Any) -> InvalidRecordError:
    """The error for a record without a key in a compacted log (nothing is written)."""
    return InvalidRecordError(f"{log.path}: a compacted log (cleanup_policy={log.config.cleanup_policy!r}) "
                              "does not accept records without a key")


def append_general(log: Any, value: Any, key: Any, headers: Any, timestamp: Any) -> int:
    """Log.append for everything off its fast path: conversions, headers, timestamps, codecs."""
    if key is None and log._keys_required:
        raise keyless_record_error(log)
    if value is not None and value.__class__ is not bytes:
        value = as_bytes(value, "value")
    if key is not None and key.__class__ is not bytes:
        key = as_bytes(key, "key")
    hbytes, hcount = encode_headers(headers) if headers else (_NULL, 0)
    if timestamp is None or log._ts_type:
        ts = _time_ns() // 1_000_000
    elif timestamp.__class__ is int and TS_MIN <= timestamp <= TS_MAX:
        ts = timestamp
    else:
        ts = check_timestamp(timestamp)
    if log._forced_codec:
        return log.append_batch([value], [key], [list(headers)] if headers else None, [ts])
    with log._lock, log._w:
        if ts > log._roll_deadline:
            roll_for_time(log, ts)
        offset = _append_record(
            log._appender, ts, log._record_attrs,
            _NULL if key is None else key, -1 if key is None else len(key),
            _NULL if value is None else value, -1 if value is None else len(value),
            hbytes, 0 if hcount == 0 else len(hbytes), hcount,
        )
        if offset < 0:
            offset = append_record_slow(log, offset, ts, key, value, hbytes, hcount)
        if offset < log._flush_at:
            return offset
    return log._after_append(offset)


def _deadline_after(log: Any, first_timestamp: int) -> int:
    """Kafka's segment.ms rule: roll once a record is newer than the segment's first batch's
    max timestamp by more than segment_ms - segment_jitter_ms."""
    return min(NEVER, first_timestamp + log.config.segment_ms - log.config.segment_jitter_ms)


def roll_for_time(log: Any, timestamp: int) -> None:
    """An append with ``timestamp`` passed the roll deadline, or the deadline is unset."""
    log._check_open()
    segment = log._segments.active
    assert segment is not None
    if log._roll_deadline == DEADLINE_UNSET:
        if segment.size == 0:  # the record about to be appended sets the deadline
            log._roll_deadline = _deadline_after(log, timestamp)
            return
        log._roll_deadline = _deadline_after(log, parse_header(segment.buffer, 0).max_timestamp)
        if timestamp <= log._roll_deadline:
            return
    roll_segment(log)
    log._roll_deadline = _deadline_after(log, timestamp)


def roll_segment(log: Any) -> None:
    """Seal (trim + fsync) the active segment and create the next one (nothing when the active
    segment is empty); everything below the new segment is durable, and the checkpoints say so
    (and a loaded producer state is written as the snapshot at the new segment's base)."""
    with log._io_guard():
        if log._segments.active.size == 0:
            log._roll_deadline = NEVER
            return
        segment = log._segments.roll(log._appender.partition_leader_epoch)
        log._set_active(segment)
        base = segment.base_offset
        if base > log._recovery_point:
            log._recovery_point = base
            log._flushed_offset = max(log._flushed_offset, base)
        log._write_checkpoints()
        # Everything below base is fsynced: a snapshot of the producer state there is sound.
        log._producers.take_snapshot(log._log_start_offset, base)


def append_record_slow(log: Any, rc: int, ts: int, key: bytes | None, value: bytes | None,
                       hbytes: Any, hcount: int) -> int:
    """Handle FULL (roll or grow, then retry) and TOO_LARGE for the single-record path."""
    log._check_open()
    hlen = 0 if hcount == 0 else len(hbytes)
    needed = (lib.LS_BATCH_HEADER_SIZE + lib.LS_RECORD_MAX_OVERHEAD + (len(key) if key else 0)
              + (len(value) if value else 0) + hlen)
    for _ in range(3):
        if rc == lib.LS_ERR_TOO_LARGE:
            raise RecordTooLargeError(one_record_batch_size(key, value, hlen, hcount),
                                      log.config.max_message_bytes)
        if rc != lib.LS_ERR_FULL:
            check(rc, log._active.path if log._active else None)
        make_room(log, needed)
        rc = _append_record(
            log._appender, ts, log._record_attrs,
            _NULL if key is None else key, -1 if key is None else len(key),
            _NULL if value is None else value, -1 if value is None else len(value),
            hbytes, hlen, hcount,
        )
        if rc >= 0:
            return rc
    raise AssertionError(f"append still failing after rolling ({rc})")  # pragma: no cover


def make_room(log: Any, needed: int) -> None:
    """The active segment reported FULL for a batch of about ``needed`` bytes: grow its map,
    or roll when it should (segment_bytes) or cannot grow."""
    segment = log._segments.active
    assert segment is not None
    with log._io_guard():
        if segment.should_roll_for(needed) or not segment.grow_for(needed):
            roll_segment(log)


def append_encoded_locked(log: Any, batch: Any, max_timestamp: int) -> int:
    """Append one encoded batch to the active segment (rolling for time or room first);
    return its base offset."""
    if max_timestamp > log._roll_deadline:
        roll_for_time(log, max_timestamp)
    offset = log._active.append_batch(batch)
    if offset == lib.LS_ERR_FULL:
        make_room(log, len(batch))
        offset = log._active.append_batch(batch)
    if offset < 0:
        check(offset, log._active.path, size=len(batch), limit=log.config.max_message_bytes)
    return offset


def append_records_locked(log: Any, values: Any, keys: Any, headers: Any, timestamps: Any, codec: int,
                          producer_id: int = -1, producer_epoch: int = 0, base_sequence: int = -1,
                          control: bool = False) -> int:
    """Log.append_batch's work under the log's locks: encode the records (as several batches
    above max_message_bytes), append them, teach the producer state each batch of a producer;
    return the first offset."""
    batches = encode_batches(log._builder, values, keys, headers, timestamps,
                             limit=log.config.max_message_bytes, codec=codec,
                             level=log.config.level_for(codec), timestamp_type=log._ts_type,
                             log_append_time=_time_ns() // 1_000_000 if log._ts_type else None,
                             producer_id=producer_id, base_sequence=base_sequence, control=control,
                             producer_epoch=producer_epoch)
    first = -1
    for batch, max_ts in batches:
        offset = append_encoded_locked(log, batch, max_ts)
        if first < 0:
            first = offset
        if producer_id >= 0 and log._producers.loaded:
            log._producers.learn(producer_id, parse_header(batch), offset)
    return first


def append_client_batch(log: Any, batch: Any, check_sequence: bool = True) -> AppendInfo:
    """Log.append_idempotent: validate a client's batch whole; for a producer's batch, check it
    against the producer state (a duplicate is answered with its offsets, nothing appended);
    store its bytes with the offsets and leader epoch assigned (re-encoded when the log's policy
    needs other bytes) and teach the producer state the batch, all under the log's locks."""
    header = validate_client_batch(batch, log.config.max_message_bytes)
    forced = log._forced_codec
    records = data = None
    if log._keys_required or log._ts_type or (forced is not None and forced != header.compression):
        # The log's policy changes the bytes: the records are encoded again (keeping the
        # producer id, epoch and sequence), decoded here, outside the locks.
        records = decode_batches(batch)
        if log._keys_required and any(r.key is None for r in records):
            raise keyless_record_error(log)
    else:
        data = bytearray(batch)  # stamped in place with the offsets and epoch
    pid = header.producer_id
    with log._lock, log._w:
        log._check_open()
        if pid >= 0:
            table = log._producers.current(log._log_start_offset, log._appender.next_offset)
            last_sequence = increment_sequence(header.base_sequence, header.last_offset_delta)
            known = table.check(pid, header.producer_epoch, header.base_sequence, last_sequence, check_sequence,
                                log.path)
            if known is not None:
                return AppendInfo(known.first_offset, known.last_offset, True)
        if records is None:
            first = append_encoded_locked(log, data, header.max_timestamp)
            if pid >= 0:
                log._producers.learn(pid, header, first)
        else:
            first = append_records_locked(
                log, [r.value for r in records], [r.key for r in records], [r.headers for r in records],
                [r.timestamp for r in records], header.compression if forced is None else forced,
                pid, header.producer_epoch, header.base_sequence if pid >= 0 else -1)
        last = log._appender.next_offset - 1
        if last < log._flush_at:
            return AppendInfo(first, last, False)
    log._after_append(last)
    return AppendInfo(first, last, False)
