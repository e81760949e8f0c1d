"""Snappy in snappy-java's xerial stream framing, the form Kafka stores snappy batches in.

The stream of ``SnappyOutputStream``: the 16-byte header ``82 'SNAPPY' 00 | int32 BE version = 1
| int32 BE compatible version = 1`` followed by blocks of ``int32 BE compressed length | raw
snappy block``, one block per 32 KiB of input. Like ``SnappyInputStream``, reading also accepts a
plain raw snappy blob (anything that does not start with the 8 magic bytes), concatenated xerial
streams, and any version >= 1. Every length, and every block's declared uncompressed size, is
checked against ``max_size`` before anything is decompressed.

The raw snappy functions are arguments: :mod:`logstore.records.compression` binds the library (cramjam
or python-snappy) and passes what it holds at call time. Thread-safe: nothing is shared.
"""

from __future__ import annotations

from typing import Any, Callable

from .codecbase import I32_BE, SNAPPY, corrupt, too_big

__all__ = ["compress", "decompress"]


_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + (1).to_bytes(4, "big") + (1).to_bytes(4, "big")
_XERIAL_HEADER_SIZE = 16
_XERIAL_MAGIC_HEAD = I32_BE.unpack(_XERIAL_MAGIC[:4])[0]  # a block length that starts a new header
_XERIAL_BLOCK_SIZE = 32 * 1024  # snappy-java SnappyOutputStream.DEFAULT_BLOCK_SIZE


def compress(compress_raw: Callable[[Any], Any], data: Any) -> bytes:
    """A xerial stream of ``data``, as SnappyOutputStream writes it, with the raw snappy
    compressor ``compress_raw``."""
    n = len(data)
    if n <= _XERIAL_BLOCK_SIZE:
        if n == 0:
            return _XERIAL_HEADER  # snappy-java writes the header even for an empty stream
        block = compress_raw(data)
        return b"".join((_XERIAL_HEADER, I32_BE.pack(len(block)), block))
    if type(data) is memoryview:
        return _xerial_encode(compress_raw, data, n)
    with memoryview(data) as mv:
        return _xerial_encode(compress_raw, mv, n)


def _xerial_encode(compress_raw: Callable[[Any], Any], mv: memoryview, n: int) -> bytes:
    parts: list[Any] = [_XERIAL_HEADER]
    append = parts.append
    pack = I32_BE.pack
    for off in range(0, n, _XERIAL_BLOCK_SIZE):
        with mv[off : off + _XERIAL_BLOCK_SIZE] as chunk:
            block = compress_raw(chunk)
        append(pack(len(block)))
        append(block)
    return b"".join(parts)


def _snappy_length(buf: Any, start: int, end: int) -> int:
    """Uncompressed length declared by the varint that starts a raw snappy block."""
    result = 0
    shift = 0
    i = start
    while True:
        if i >= end:
            raise corrupt(SNAPPY, "truncated block (incomplete length header)")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 28:
            raise corrupt(SNAPPY, "invalid block length header (varint longer than 5 bytes)")
    if result > 0xFFFFFFFF:
        raise corrupt(SNAPPY, "invalid block length header (length >= 2**32)")
    return result


def _snappy_raw(uncompress: Callable[[Any], Any], errors: tuple[type[BaseException], ...], block: Any) -> Any:
    try:
        return uncompress(block)
    except errors as exc:
        raise corrupt(SNAPPY, f"invalid snappy block ({exc})") from None


def decompress(uncompress: Callable[[Any], Any], errors: tuple[type[BaseException], ...], data: Any,
               max_size: int) -> bytes:
    """The bytes of a xerial stream (or of a plain raw snappy blob), at most ``max_size`` of them;
    ``uncompress`` is the raw snappy decompressor and ``errors`` the exceptions it raises for bad
    input (they become CorruptRecordError)."""
    buf = data
    n = len(buf)
    if n == 0:
        return b""
    if n < _XERIAL_HEADER_SIZE or buf[:8] != _XERIAL_MAGIC:
        # Not a xerial stream: a plain raw snappy blob, as SnappyInputStream falls back to.
        size = _snappy_length(buf, 0, n)
        if size > max_size:
            raise too_big(SNAPPY, max_size, size)
        out = _snappy_raw(uncompress, errors, buf)
        return out if type(out) is bytes else bytes(out)

    # Walk the framing first: check every length (and the declared uncompressed sizes against
    # max_size) before decompressing anything.
    blocks: list[tuple[int, int]] = []
    total = 0
    pos = 0
    unpack_from = I32_BE.unpack_from
    while pos < n:
        if n - pos < 4:
            raise corrupt(SNAPPY, f"truncated stream ({n - pos} bytes at {pos}; a block length needs 4)")
        length = unpack_from(buf, pos)[0]
        if length == _XERIAL_MAGIC_HEAD or pos == 0:  # a (concatenated) stream header
            if n - pos < _XERIAL_HEADER_SIZE or buf[pos : pos + 8] != _XERIAL_MAGIC:
                raise corrupt(SNAPPY, f"invalid xerial stream header at {pos}")
            version = unpack_from(buf, pos + 8)[0]
            if version < 1:
                raise corrupt(SNAPPY, f"unsupported xerial stream version {version} at {pos}")
            pos += _XERIAL_HEADER_SIZE
            continue
        if length <= 0:
            raise corrupt(SNAPPY, f"invalid block length {length} at {pos}")
        start = pos + 4
        pos = start + length
        if pos > n:
            raise corrupt(
                SNAPPY, f"truncated stream (block at {start - 4} declares {length} bytes, {n - start} remain)"
            )
        total += _snappy_length(buf, start, pos)
        if total > max_size:
            raise too_big(SNAPPY, max_size, total)
        blocks.append((start, pos))

    if not blocks:
        return b""
    if type(buf) is memoryview:
        return _xerial_decode(uncompress, errors, buf, blocks)
    with memoryview(buf) as mv:
        return _xerial_decode(uncompress, errors, mv, blocks)


def _xerial_decode(
    uncompress: Callable[[Any], Any], errors: tuple[type[BaseException], ...], mv: memoryview,
    blocks: list[tuple[int, int]]
) -> bytes:
    if len(blocks) == 1:
        start, end = blocks[0]
        with mv[start:end] as block:
            out = _snappy_raw(uncompress, errors, block)
        return out if type(out) is bytes else bytes(out)
    parts = []
    for start, end in blocks:
        with mv[start:end] as block:
            parts.append(_snappy_raw(uncompress, errors, block))
    return b"".join(parts)
