"""LZ4 frames: written exactly as Kafka's Lz4BlockOutputStream writes them, read with bounded output.

Writing: header bytes ``04 22 4D 18 60 40 82`` (version 1, independent blocks, 64 KiB maximum
block, no checksums, no content size), then every 64 KiB chunk compressed on its own by
``LZ4_compress_default`` (the default level, and level 9, as Kafka's ``fastCompressor``) or
``LZ4_compress_HC`` (other levels, as ``highCompressor(level)``) and stored raw with the high bit
of its length set when that is not smaller, then a zero end mark. With the same lz4 C library
the bytes equal Kafka's. Reading walks the frame's block headers to bound the output before the
LZ4F decoder runs, so any valid frame is accepted and none can make it allocate much more than
``max_size``.

The ``lz4`` package is an argument: :mod:`logstore.records.compression` binds it and passes what it
holds at call time. Thread-safe: the LZ4F decompression context, which is not, is kept per
thread (``threading.local``).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from .codecbase import LZ4, U32_LE, U64_LE, check_level, corrupt, too_big

__all__ = ["compress", "decompress"]

_tls = threading.local()


_LZ4_MAGIC = 0x184D2204
_LZ4_KAFKA_DEFAULT_LEVEL = 9  # CompressionType.LZ4.defaultLevel(): Kafka uses the fast compressor for it
_LZ4_BLOCK_SIZE = 64 * 1024  # Lz4BlockOutputStream.BLOCKSIZE_64KB
# magic, FLG (version 1, independent blocks), BD (64 KiB), header checksum (xxh32(FLG BD) >> 8)
_LZ4_KAFKA_HEADER = bytes([0x04, 0x22, 0x4D, 0x18, 0x60, 0x40, 0x82])
_LZ4_END_MARK = b"\x00\x00\x00\x00"


def compress(lz4: Any, data: Any, level: int | None) -> bytes:
    """An LZ4 frame of ``data`` exactly as Kafka's Lz4BlockOutputStream writes it at ``level``
    (None: Kafka's default), with the ``lz4`` package ``lz4``."""
    block_compress = lz4.block.compress
    if level is None or level == _LZ4_KAFKA_DEFAULT_LEVEL:
        hc_level = 0  # Kafka's fastCompressor: LZ4_compress_default
    else:
        hc_level = check_level(LZ4, level, 1, 17)  # Kafka's highCompressor(level): LZ4_compress_HC
    n = len(data)
    if n <= _LZ4_BLOCK_SIZE:
        if n == 0:
            return _LZ4_KAFKA_HEADER + _LZ4_END_MARK
        header, block = _lz4_block(block_compress, hc_level, data, n)
        return b"".join((_LZ4_KAFKA_HEADER, header, block, _LZ4_END_MARK))
    if type(data) is memoryview:
        return _lz4_encode(block_compress, hc_level, data, n)
    with memoryview(data) as mv:
        return _lz4_encode(block_compress, hc_level, mv, n)


def _lz4_block(
    block_compress: Callable[..., bytes], hc_level: int, chunk: Any, size: int
) -> tuple[bytes, Any]:
    """(block header, block data) for one chunk, as Lz4BlockOutputStream.writeBlock() writes it."""
    if hc_level:
        block = block_compress(chunk, mode="high_compression", compression=hc_level, store_size=False)
    else:
        block = block_compress(chunk, store_size=False)
    if len(block) >= size:  # incompressible: store the chunk itself, flagged uncompressed
        return U32_LE.pack(size | 0x80000000), chunk
    return U32_LE.pack(len(block)), block


def _lz4_encode(block_compress: Callable[..., bytes], hc_level: int, mv: memoryview, n: int) -> bytes:
    parts: list[Any] = [_LZ4_KAFKA_HEADER]
    chunks: list[memoryview] = []
    try:
        for off in range(0, n, _LZ4_BLOCK_SIZE):
            chunk = mv[off : off + _LZ4_BLOCK_SIZE]
            chunks.append(chunk)
            parts.extend(_lz4_block(block_compress, hc_level, chunk, len(chunk)))
        parts.append(_LZ4_END_MARK)
        return b"".join(parts)
    finally:
        for chunk in chunks:
            chunk.release()


def _lz4_frame_bound(buf: Any, n: int) -> tuple[int, int, int]:
    """Walk an LZ4 frame's block headers.

    Returns (frame length, upper bound of the decompressed size, declared content size or -1).
    The bound is the sum over blocks of the stored size (uncompressed blocks) or the frame's
    maximum block size (compressed blocks), or the declared content size when that is smaller.
    """
    if n < 7:
        raise corrupt(LZ4, f"truncated frame header ({n} bytes)")
    magic = U32_LE.unpack_from(buf, 0)[0]
    if magic != _LZ4_MAGIC:
        raise corrupt(LZ4, f"bad frame magic {magic:#010x}")
    flg = buf[4]
    bd = buf[5]
    if flg >> 6 != 1:
        raise corrupt(LZ4, f"unsupported frame version {flg >> 6}")
    if flg & 0x02 or bd & 0x8F:
        raise corrupt(LZ4, "reserved bits set in frame descriptor")
    block_id = (bd >> 4) & 7
    if block_id < 4:
        raise corrupt(LZ4, f"invalid block maximum size id {block_id}")
    block_max = 1 << (2 * block_id + 8)
    block_checksum = 4 if flg & 0x10 else 0
    pos = 6
    content_size = -1
    if flg & 0x08:
        if n < pos + 8:
            raise corrupt(LZ4, "truncated frame header")
        content_size = U64_LE.unpack_from(buf, pos)[0]
        pos += 8
    if flg & 0x01:
        pos += 4  # dictionary id
    pos += 1  # header checksum (verified by the library)
    bound = 0
    unpack_from = U32_LE.unpack_from
    while True:
        if n < pos + 4:
            raise corrupt(LZ4, "truncated frame (missing block header or end mark)")
        word = unpack_from(buf, pos)[0]
        pos += 4
        if word == 0:
            break
        size = word & 0x7FFFFFFF
        if size > block_max:
            raise corrupt(LZ4, f"block of {size} bytes exceeds the frame's {block_max}-byte maximum")
        pos += size + block_checksum
        if pos > n:
            raise corrupt(LZ4, "truncated frame (block runs past the end)")
        bound += size if word & 0x80000000 else block_max
    if flg & 0x04:
        pos += 4  # content checksum
        if pos > n:
            raise corrupt(LZ4, "truncated frame (missing content checksum)")
    if content_size >= 0:
        if content_size > bound:
            raise corrupt(LZ4, f"declared content size {content_size} is more than its blocks hold ({bound})")
        bound = content_size
    return pos, bound, content_size


def _lz4_context(lz4f: Any) -> Any:
    try:
        ctx = _tls.lz4_dctx
    except AttributeError:
        ctx = _tls.lz4_dctx = lz4f.create_decompression_context()
    else:
        lz4f.reset_decompression_context(ctx)
    return ctx


def decompress(lz4: Any, data: Any, max_size: int) -> bytes:
    """The bytes of one LZ4 frame (any valid frame), at most ``max_size`` of them, with the
    ``lz4`` package ``lz4``."""
    lz4f = lz4.frame
    buf = data
    n = len(buf)
    if n == 0:
        return b""
    end, bound, content_size = _lz4_frame_bound(buf, n)
    if end != n:
        raise corrupt(LZ4, f"{n - end} bytes of trailing data after the frame")
    if content_size > max_size:
        raise too_big(LZ4, max_size, content_size)
    # decompress_chunk allocates max_length up front: size it from the frame, never more than
    # max_size + 1 (one byte more than allowed tells a bomb from an exact fit).
    limit = min(bound, max_size) + 1
    ctx = _lz4_context(lz4f)  # reset before every use, so a failed call leaves no state behind
    try:
        out, consumed, eof = lz4f.decompress_chunk(ctx, buf, max_length=limit)
    except (RuntimeError, ValueError) as exc:
        raise corrupt(LZ4, f"invalid frame ({exc})") from None
    if len(out) > max_size:
        raise too_big(LZ4, max_size)
    if not eof or consumed != n:
        raise corrupt(LZ4, "frame did not decode to its end mark (corrupt block data)")
    return out
