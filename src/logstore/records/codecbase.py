"""Codec ids and names, and the error and level helpers that the compression modules share.

The codec ids are attributes bits 0-2 of a RecordBatch v2, re-exported from the C header
(``logstore.h``), never retyped; :mod:`logstore.records.compression` re-exports them as its public
names. Errors follow one form: :class:`~logstore.errors.CorruptRecordError` with ``path`` and
``position`` None and a reason ``"<codec>: <what was wrong>"`` (the segment reader re-raises it
with the batch's file and position). Thread-safe: constants and pure functions.

The codec functions (here, in :mod:`logstore.records.xerial`, :mod:`logstore.records.lz4frame` and
:mod:`logstore.records.zstdframe`) take bytes, bytearray or a 1-D memoryview of format "B" (what the
public functions of :mod:`logstore.records.compression` pass them): len() is the size in bytes and
indexing gives ints. Every memoryview they make of the caller's data is released with `with`
before they return or raise: a traceback kept alive by the caller (``raise ... from exc``) must
not pin an export of the caller's buffer (the segment reader releases its view, and an mmap
cannot close while exports exist).
"""

from __future__ import annotations

import struct
from typing import Any

from .._native import lib
from ..errors import CorruptRecordError

__all__ = ["NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD", "NAMES", "corrupt", "too_big", "check_level",
           "check_no_level"]

NONE: int = lib.LS_COMPRESSION_NONE
GZIP: int = lib.LS_COMPRESSION_GZIP
SNAPPY: int = lib.LS_COMPRESSION_SNAPPY
LZ4: int = lib.LS_COMPRESSION_LZ4
ZSTD: int = lib.LS_COMPRESSION_ZSTD

NAMES = ("none", "gzip", "snappy", "lz4", "zstd")  # codec id -> canonical name

U32_LE = struct.Struct("<I")
U64_LE = struct.Struct("<Q")
I32_BE = struct.Struct(">i")


def corrupt(codec: int, what: str) -> CorruptRecordError:
    """The error for a malformed, truncated or oversized blob of ``codec``."""
    return CorruptRecordError(None, None, f"{NAMES[codec]}: {what}")


def too_big(codec: int, max_size: int, declared: int | None = None) -> CorruptRecordError:
    """The error for a blob that decompresses (or declares it does) to more than ``max_size``."""
    if declared is None:
        return corrupt(codec, f"decompressed size exceeds max_size = {max_size} bytes")
    return corrupt(codec, f"declared decompressed size {declared} exceeds max_size = {max_size} bytes")


def check_no_level(codec: int, level: int | None) -> None:
    """Raise ValueError unless ``level`` is None (for codecs without levels)."""
    if level is not None:
        raise ValueError(f"{NAMES[codec]} has no compression levels; pass level=None, got {level!r}")


def check_level(codec: int, level: Any, lo: int, hi: int, extra: tuple[int, ...] = ()) -> int:
    """``level`` as an int if it is in lo..hi or in ``extra``, else ValueError naming the range."""
    if type(level) is bool or not isinstance(level, int) or not (lo <= level <= hi or level in extra):
        allowed = f"{lo}..{hi}" + "".join(f" or {e}" for e in extra)
        raise ValueError(f"{NAMES[codec]} compression level must be {allowed}, got {level!r}")
    return int(level)
