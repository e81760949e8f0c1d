"""Batching: an append's arguments turned into record batches that a log may store.

Argument checks (bytes-like keys and values, 64-bit timestamps, int offsets), the codec an
append asks for, the encoding of records into batches none of which exceeds
``max_message_bytes``, and the exact size of the one-record batch the C appender writes (for
RecordTooLargeError). Used by :class:`~logstore.log.log.Log`'s append paths; no state, no I/O.
"""

from __future__ import annotations

from typing import Any, Sequence

from . import compression
from .._native import lib
from ..errors import RecordTooLargeError, UnsupportedCodecError
from .batch import BatchBuilder

__all__ = ["as_bytes", "check_timestamp", "check_offset", "codec_for", "check_available", "encode_batches",
           "one_record_batch_size"]


def as_bytes(value: Any, what: str) -> bytes:
    """``value`` (a bytearray or memoryview) as bytes; TypeError naming ``what`` otherwise."""
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes or None, got {type(value).__name__}")


def check_timestamp(timestamp: Any) -> int:
    """``timestamp`` as an int of 64 bits (ms since the epoch); TypeError/ValueError otherwise."""
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise TypeError(f"timestamp must be an int (ms since epoch) or None, got {type(timestamp).__name__}")
    if not -(2**63) <= timestamp < 2**63:
        raise ValueError(f"timestamp {timestamp} does not fit in 64 bits")
    return int(timestamp)


def check_offset(offset: Any) -> int:
    """``offset`` as an int; TypeError otherwise (bool is refused)."""
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int, got {type(offset).__name__}")
    return int(offset)


def codec_for(name: str | int | None) -> int:
    """The codec id an append's ``compression`` argument names (None: none)."""
    if name is None:
        return compression.NONE
    codec = compression.codec_from_name(name)
    check_available(codec)
    return codec


def check_available(codec: int) -> None:
    """Raise UnsupportedCodecError when ``codec`` needs a package that is not installed."""
    if codec not in compression.available_codecs():
        raise UnsupportedCodecError(
            f"compression codec {compression.codec_name(codec)!r} needs a package that is not "
            "installed (reinstall logstore, which depends on it)"
        )


def encode_batches(builder: BatchBuilder, values: Sequence[Any], keys: Any, headers: Any, timestamps: Any, *,
                   limit: int, codec: int, level: int | None, timestamp_type: int, log_append_time: int | None,
                   producer_id: int = -1, base_sequence: int = -1, control: bool = False,
                   producer_epoch: int = 0, transactional: bool = False) -> list[tuple[Any, int]]:
    """Encode the records as one batch, or as several when one would exceed ``limit`` bytes;
    return ``(batch, max timestamp)`` pairs in order. With a ``producer_id``, the pieces carry
    ``producer_epoch`` and consecutive base sequences from ``base_sequence``.

    Every piece is encoded before anything is appended, so a single record over the limit
    fails the whole call with RecordTooLargeError and nothing is written. The whole input as
    one batch may stay in the builder's scratch space (no copy): the caller appends it before
    the next build. Split pieces are copies.
    """
    kw: dict[str, Any] = dict(codec=codec, level=level, timestamp_type=timestamp_type,
                              log_append_time=log_append_time, control=control, transactional=transactional)
    if producer_id >= 0:
        kw.update(producer_id=producer_id, producer_epoch=producer_epoch)
    return _encode_range(builder, values, keys, headers, timestamps, 0, len(values), limit, producer_id,
                         base_sequence, kw)


def _encode_range(builder: BatchBuilder, values: Sequence[Any], keys: Any, headers: Any, timestamps: Any,
                  lo: int, hi: int, limit: int, producer_id: int, base_sequence: int,
                  kw: dict[str, Any]) -> list[tuple[Any, int]]:
    """encode_batches' records [lo, hi), halved until each piece fits ``limit``. (A function of
    the module, not a closure: a closure that calls itself is a reference cycle, and one per
    append made the cyclic collector run every few dozen appends.)"""
    whole = lo == 0 and hi == len(values)
    if producer_id >= 0:
        kw["base_sequence"] = base_sequence + lo if base_sequence >= 0 else -1
    batch = builder.build(
        values if whole else values[lo:hi],
        keys if keys is None or whole else keys[lo:hi],
        headers if headers is None or whole else headers[lo:hi],
        timestamps if timestamps is None or whole else timestamps[lo:hi], copy=not whole, **kw)
    if len(batch) <= limit:
        return [(batch, builder.last_max_timestamp)]
    if hi - lo == 1:
        raise RecordTooLargeError(len(batch), limit)
    del batch  # release the scratch view before building the halves
    mid = (lo + hi) // 2
    args = (limit, producer_id, base_sequence, kw)
    return (_encode_range(builder, values, keys, headers, timestamps, lo, mid, *args)
            + _encode_range(builder, values, keys, headers, timestamps, mid, hi, *args))


def _varint_size(value: int) -> int:
    zigzag = (value << 1) ^ (value >> 63)
    size = 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


def one_record_batch_size(key: bytes | None, value: bytes | None, headers_len: int, header_count: int) -> int:
    """Exact size of the one-record batch ls_appender_append_record writes."""
    kl = -1 if key is None else len(key)
    vl = -1 if value is None else len(value)
    body = (3 + _varint_size(kl) + max(kl, 0) + _varint_size(vl) + max(vl, 0)
            + _varint_size(header_count) + headers_len)
    return lib.LS_BATCH_HEADER_SIZE + _varint_size(body) + body
