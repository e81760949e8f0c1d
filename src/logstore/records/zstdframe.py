"""zstd frames: written as Kafka writes them (level 3), read by walking the frames to bound the output.

Writing: a single zstd frame at level 3 (Kafka's default), with the content size recorded in the
frame header (Kafka's streaming writer leaves it out; every reader accepts both). Reading
accepts frames with or without content size or checksum, concatenated frames and skippable
frames; it walks every frame's block headers first, so that truncation is reported (the
zstandard streaming API cannot) and no frame can make it allocate much more than ``max_size``.

The ``zstandard`` package is an argument: :mod:`logstore.records.compression` binds it and passes what
it holds at call time. Thread-safe: the compressors (one per level) and the decompressor, which
are not, are kept per thread (``threading.local``).
"""

from __future__ import annotations

import threading
from typing import Any

from .codecbase import U32_LE, U64_LE, ZSTD, check_level, corrupt, too_big

__all__ = ["compress", "decompress"]

_tls = threading.local()


_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE_MASK = 0xFFFFFFF0
_ZSTD_SKIPPABLE_MAGIC = 0x184D2A50
_ZSTD_BLOCK_MAX = 128 * 1024  # no block decompresses to more than this
_ZSTD_DEFAULT_LEVEL = 3  # Kafka's CompressionType.ZSTD.defaultLevel()
_ZSTD_MIN_LEVEL = -(1 << 17)  # ZSTD_minCLevel(), Kafka's minimum
_ZSTD_MAX_LEVEL = 22
_DID_SIZES = (0, 1, 2, 4)
_FCS_SIZES = (0, 2, 4, 8)


def compress(zstd: Any, data: Any, level: int | None) -> bytes:
    """One zstd frame of ``data`` at ``level`` (None: Kafka's default, 3), its content size in
    the header, with the ``zstandard`` package ``zstd``."""
    if level is None:
        lvl = _ZSTD_DEFAULT_LEVEL
    else:
        lvl = check_level(ZSTD, level, _ZSTD_MIN_LEVEL, _ZSTD_MAX_LEVEL)
    try:
        cache = _tls.zstd_cctx
    except AttributeError:
        cache = _tls.zstd_cctx = {}
    cctx = cache.get(lvl)
    if cctx is None:
        cctx = cache[lvl] = zstd.ZstdCompressor(level=lvl, write_checksum=False, write_content_size=True)
    return cctx.compress(data)


def _zstd_frames(buf: Any, n: int) -> list[tuple[int, int, int, int]]:
    """Walk zstd frames: [(start, end, declared content size or -1, decompressed size bound)].

    Skippable frames are checked and left out. Raises CorruptRecordError for bad magic numbers,
    reserved block types and any truncation (which the zstandard streaming API cannot report).
    """
    frames = []
    pos = 0
    u32 = U32_LE.unpack_from
    while pos < n:
        if n - pos < 4:
            raise corrupt(ZSTD, f"truncated stream ({n - pos} trailing bytes at {pos})")
        magic = u32(buf, pos)[0]
        if magic != _ZSTD_MAGIC:
            if magic & _ZSTD_SKIPPABLE_MASK == _ZSTD_SKIPPABLE_MAGIC:
                if n - pos < 8:
                    raise corrupt(ZSTD, "truncated skippable frame")
                pos += 8 + u32(buf, pos + 4)[0]
                if pos > n:
                    raise corrupt(ZSTD, "truncated skippable frame")
                continue
            raise corrupt(ZSTD, f"bad frame magic {magic:#010x} at {pos}")
        if n - pos < 6:
            raise corrupt(ZSTD, "truncated frame header")
        fhd = buf[pos + 4]
        single_segment = (fhd >> 5) & 1
        fcs_flag = fhd >> 6
        fcs_size = _FCS_SIZES[fcs_flag] if fcs_flag or not single_segment else 1
        p = pos + 5 + (0 if single_segment else 1) + _DID_SIZES[fhd & 3]
        header_end = p + fcs_size
        if header_end > n:
            raise corrupt(ZSTD, "truncated frame header")
        if fcs_size == 0:
            content_size = -1
        elif fcs_size == 8:
            content_size = U64_LE.unpack_from(buf, p)[0]
        else:
            content_size = int.from_bytes(buf[p:header_end], "little") + (256 if fcs_size == 2 else 0)
        p = header_end
        bound = 0
        while True:
            if n - p < 3:
                raise corrupt(ZSTD, "truncated frame (missing block header)")
            bh = buf[p] | (buf[p + 1] << 8) | (buf[p + 2] << 16)
            p += 3
            block_type = (bh >> 1) & 3
            size = bh >> 3
            if block_type == 0:  # raw
                p += size
                bound += size
            elif block_type == 1:  # RLE: one byte repeated `size` times
                p += 1
                bound += size
            elif block_type == 2:  # compressed
                p += size
                bound += _ZSTD_BLOCK_MAX
            else:
                raise corrupt(ZSTD, f"reserved block type at {p - 3}")
            if p > n:
                raise corrupt(ZSTD, "truncated frame (block runs past the end)")
            if bh & 1:  # last block
                break
        if (fhd >> 2) & 1:
            p += 4  # content checksum
            if p > n:
                raise corrupt(ZSTD, "truncated frame (missing content checksum)")
        if content_size > bound:
            raise corrupt(ZSTD, f"declared content size {content_size} is more than its blocks hold ({bound})")
        frames.append((pos, p, content_size, bound))
        pos = p
    return frames


def _zstd_decompressor(zstd: Any) -> Any:
    try:
        return _tls.zstd_dctx
    except AttributeError:
        dctx = _tls.zstd_dctx = zstd.ZstdDecompressor()
        return dctx


def _zstd_frame(zstd: Any, dctx: Any, frame: Any, content_size: int, bound: int, budget: int,
                max_size: int) -> bytes:
    """Decompress one complete frame (already walked) into at most `budget` bytes."""
    if content_size > budget:
        raise too_big(ZSTD, max_size, content_size + max_size - budget)
    try:
        if content_size > 0:
            return dctx.decompress(frame)  # allocates exactly content_size; checks it
        if 0 < bound <= budget and content_size < 0:
            # No content size (Kafka's writer): bound is within 128 KiB of the real size.
            return dctx.decompress(frame, max_output_size=bound)
        # Empty frames, and frames whose bound exceeds the budget (possible bombs): stream at
        # most budget + 1 bytes. The source is copied so no reader holds the caller's buffer.
        limit = min(bound, budget)
        out = dctx.stream_reader(bytes(frame)).read(limit + 1)
    except zstd.ZstdError as exc:
        raise corrupt(ZSTD, f"invalid frame ({exc})") from None
    if len(out) > budget:
        raise too_big(ZSTD, max_size)
    if len(out) > bound or 0 <= content_size != len(out):
        raise corrupt(ZSTD, "frame decoded to more data than its header or blocks declare")
    return out


def decompress(zstd: Any, data: Any, max_size: int) -> bytes:
    """The bytes of zstd frames (skippable frames left out), at most ``max_size`` of them, with
    the ``zstandard`` package ``zstd``."""
    n = len(data)
    if n == 0:
        return b""
    frames = _zstd_frames(data, n)
    dctx = _zstd_decompressor(zstd)
    if len(frames) == 1 and frames[0][0] == 0 and frames[0][1] == n:
        _, _, content_size, bound = frames[0]
        return _zstd_frame(zstd, dctx, data, content_size, bound, max_size, max_size)
    if type(data) is memoryview:
        return _zstd_decode_frames(zstd, dctx, data, frames, max_size)
    with memoryview(data) as mv:
        return _zstd_decode_frames(zstd, dctx, mv, frames, max_size)


def _zstd_decode_frames(
    zstd: Any, dctx: Any, mv: memoryview, frames: list[tuple[int, int, int, int]], max_size: int
) -> bytes:
    parts = []
    total = 0
    for start, end, content_size, bound in frames:
        with mv[start:end] as frame:
            part = _zstd_frame(zstd, dctx, frame, content_size, bound, max_size - total, max_size)
        total += len(part)
        parts.append(part)
    return b"".join(parts)
