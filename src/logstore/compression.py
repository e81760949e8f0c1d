"""Kafka's record-batch compression codecs, byte-compatible with the Java client and broker.

A RecordBatch v2 stores its codec in attributes bits 0-2 (:data:`NONE` ... :data:`ZSTD`). When a
batch is compressed, the whole records section (everything after the 61-byte batch header) is one
compressed blob. This module turns such blobs into bytes and back, writing what Apache Kafka writes
and reading everything Kafka reads:

gzip
    RFC 1952 gzip, as ``java.util.zip.GZIPOutputStream`` writes it (level 6 by default, which is
    Kafka's ``Deflater.DEFAULT_COMPRESSION``). Reading accepts any number of concatenated members.
    The 10-byte member header differs from Java's only in the OS byte, which no reader checks.
snappy
    The xerial snappy-java stream of ``SnappyOutputStream``: the 16-byte header
    ``82 'SNAPPY' 00 | int32 BE version = 1 | int32 BE compatible version = 1`` followed by blocks
    of ``int32 BE compressed length | raw snappy block``, one block per 32 KiB of input. Like
    ``SnappyInputStream``, reading also accepts a plain raw snappy blob (anything that does not
    start with the 8 magic bytes), concatenated xerial streams, and any version >= 1.
lz4
    The LZ4 frame format exactly as ``Lz4BlockOutputStream`` writes it: header bytes
    ``04 22 4D 18 60 40 82`` (version 1, independent blocks, 64 KiB maximum block, no checksums, no
    content size), then every 64 KiB chunk compressed on its own by ``LZ4_compress_default`` (the
    default level, and level 9, as Kafka's ``fastCompressor``) or ``LZ4_compress_HC`` (other levels,
    as ``highCompressor(level)``) and stored raw with the high bit of its length set when that is
    not smaller, then a zero end mark. With the same lz4 C library the bytes equal Kafka's. Reading
    goes through the LZ4F decoder, so any valid frame is accepted. Needs the optional ``lz4``
    package; without it LZ4 raises :class:`~logstore.errors.UnsupportedCodecError`.
zstd
    A single zstd frame at level 3 (Kafka's default), with the content size recorded in the frame
    header (Kafka's streaming writer leaves it out; every reader accepts both). Reading accepts
    frames with or without content size or checksum, concatenated frames and skippable frames.

Decompression is bounded: ``max_size`` caps the output of every codec, checked against the sizes
declared in the stream *before* allocating, so a hostile blob cannot make this module allocate
much more than ``min(max_size, real output size)``. Any malformed, truncated or oversized input
raises :class:`~logstore.errors.CorruptRecordError` with ``path`` and ``position`` set to None and
a reason of the form ``"<codec>: <what was wrong>"``; the segment reader re-raises it with the
file and position of the batch. No zlib, snappy, lz4 or zstd exception escapes.

An empty input decompresses to ``b""`` for every codec: Kafka's log cleaner keeps empty batches
(no records section at all) that still carry their original codec bits.

Thread-safety: every public function may be called from any number of threads at once. The zstd
compressors/decompressor and the lz4 decompression context are cached per thread
(``threading.local``) because those library objects are not thread-safe; nothing else is shared.
The libraries release the GIL while they work, so threads compress in parallel.

Optional libraries are bound at import to the module attributes ``_snappy_compress_raw`` /
``_snappy_uncompress_raw`` (cramjam if present, which is python-snappy's own backend and saves a
copy, else python-snappy), ``_lz4`` (the ``lz4`` package, with ``lz4.block`` and ``lz4.frame``
loaded) and ``_zstd`` (``zstandard``); each is None when its package is missing. Tests may
monkeypatch them.
"""

from __future__ import annotations

import struct
import sys
import threading
import zlib
from typing import Any, Callable

from ._native import lib
from .errors import CorruptRecordError, UnsupportedCodecError

__all__ = [
    "NONE",
    "GZIP",
    "SNAPPY",
    "LZ4",
    "ZSTD",
    "CODEC_NAMES",
    "codec_from_name",
    "codec_name",
    "compress",
    "decompress",
    "available_codecs",
]

# Codec ids of attributes bits 0-2, re-exported from the C header (logstore.h), never retyped.
NONE: int = lib.LS_COMPRESSION_NONE
GZIP: int = lib.LS_COMPRESSION_GZIP
SNAPPY: int = lib.LS_COMPRESSION_SNAPPY
LZ4: int = lib.LS_COMPRESSION_LZ4
ZSTD: int = lib.LS_COMPRESSION_ZSTD

#: Accepted codec names (lower case) -> codec id. "uncompressed" is the broker/topic spelling of
#: "none" in Kafka's ``compression.type``.
CODEC_NAMES: dict[str, int] = {
    "none": NONE,
    "uncompressed": NONE,
    "gzip": GZIP,
    "snappy": SNAPPY,
    "lz4": LZ4,
    "zstd": ZSTD,
}

_NAMES = ("none", "gzip", "snappy", "lz4", "zstd")  # codec id -> canonical name

# ---------------------------------------------------------------------------------------------
# Optional libraries
# ---------------------------------------------------------------------------------------------

_snappy_compress_raw: Callable[[Any], Any] | None
_snappy_uncompress_raw: Callable[[Any], Any] | None
_SNAPPY_ERRORS: tuple[type[BaseException], ...]

try:  # cramjam: python-snappy >= 0.7 is a thin wrapper around it that copies every result once more.
    import cramjam as _cramjam

    _snappy_compress_raw = _cramjam.snappy.compress_raw
    _snappy_uncompress_raw = _cramjam.snappy.decompress_raw
    _SNAPPY_ERRORS = (_cramjam.DecompressionError, _cramjam.CompressionError)
except (ImportError, AttributeError):
    try:
        import snappy as _python_snappy

        _snappy_compress_raw = _python_snappy.compress
        _snappy_uncompress_raw = _python_snappy.uncompress
        _SNAPPY_ERRORS = tuple(
            e
            for e in (
                getattr(_python_snappy, "UncompressError", None),
                getattr(_python_snappy, "CompressedLengthError", None),
            )
            if isinstance(e, type)
        )
    except ImportError:
        _snappy_compress_raw = None
        _snappy_uncompress_raw = None
        _SNAPPY_ERRORS = ()

_lz4: Any
try:
    import lz4.block as _lz4_block_module  # `import a.b as c` binds only c
    import lz4.frame as _lz4_frame

    _lz4 = sys.modules["lz4"]  # the one handle the code uses; its .block and .frame are loaded
    del _lz4_block_module, _lz4_frame
except ImportError:
    _lz4 = None

try:
    import zstandard as _zstd
except ImportError:
    _zstd = None  # type: ignore[assignment]

_ZstdError: type[BaseException] = _zstd.ZstdError if _zstd is not None else RuntimeError

_tls = threading.local()

# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def available_codecs() -> frozenset[int]:
    """Return the codec ids whose libraries are importable in this process.

    NONE and GZIP are always available (zlib is part of Python); SNAPPY needs cramjam or
    python-snappy, LZ4 the ``lz4`` package, ZSTD the ``zstandard`` package.

    Returns:
        A frozenset of codec ids. Thread-safe.
    """
    codecs = {NONE, GZIP}
    if _snappy_compress_raw is not None and _snappy_uncompress_raw is not None:
        codecs.add(SNAPPY)
    if _lz4 is not None:
        codecs.add(LZ4)
    if _zstd is not None:
        codecs.add(ZSTD)
    return frozenset(codecs)


def codec_name(codec: int) -> str:
    """Return the canonical name ("none", "gzip", "snappy", "lz4", "zstd") of a codec id.

    Args:
        codec: a codec id, 0 to 4.

    Returns:
        The lower-case name.

    Raises:
        ValueError: ``codec`` is not a known codec id. Thread-safe.
    """
    if type(codec) is not bool and isinstance(codec, int) and 0 <= codec < len(_NAMES):
        return _NAMES[codec]
    raise _unknown_codec(codec)


def codec_from_name(name: str | int | None, *, require_available: bool = True) -> int:
    """Resolve a codec name (or id, or None) to its codec id.

    Names are matched case-insensitively against :data:`CODEC_NAMES`: "none", "uncompressed",
    "gzip", "snappy", "lz4", "zstd". An int is accepted if it is a known codec id.

    Args:
        name: the codec name, a codec id, or None (meaning :data:`NONE`).
        require_available: when true (the default), also check that the codec's library is
            installed, so a misconfiguration fails when the log is configured rather than on the
            first append. Pass False to only parse the name.

    Returns:
        The codec id.

    Raises:
        ValueError: the name or id is not a known codec; the message lists the accepted names.
        UnsupportedCodecError: the codec is known but its library is missing (lz4, snappy, zstd)
            and ``require_available`` is true. Thread-safe.
    """
    if name is None:
        codec = NONE
    elif isinstance(name, str):
        key = name.strip().lower()
        if key not in CODEC_NAMES:
            raise ValueError(
                f"unknown compression codec {name!r}; accepted names are {', '.join(CODEC_NAMES)}"
            )
        codec = CODEC_NAMES[key]
    elif type(name) is not bool and isinstance(name, int) and 0 <= name < len(_NAMES):
        codec = int(name)
    else:
        raise ValueError(
            f"unknown compression codec {name!r}; accepted names are {', '.join(CODEC_NAMES)} "
            f"(or codec ids 0-4)"
        )
    if require_available and codec not in available_codecs():
        raise _unsupported(codec)
    return codec


def compress(codec: int, data: bytes | bytearray | memoryview, level: int | None = None) -> bytes:
    """Compress a records section the way Apache Kafka does for ``codec``.

    Args:
        codec: a codec id (:data:`NONE`, :data:`GZIP`, :data:`SNAPPY`, :data:`LZ4`, :data:`ZSTD`).
        data: the uncompressed bytes; any C-contiguous buffer. It is not copied before compressing
            and not referenced after the call returns.
        level: the codec's level, or None for Kafka's default. Ranges are Kafka's:
            gzip 1-9 or -1 (default 6); lz4 1-17 (default and 9: the fast compressor, others: HC);
            zstd -131072..22 (default 3). NONE and SNAPPY have no levels: pass None.

    Returns:
        The compressed blob (for NONE, ``data`` as bytes: the same object when it already is).

    Raises:
        ValueError: unknown codec id, or a level the codec does not accept.
        UnsupportedCodecError: the codec's library is not installed.
        Thread-safe.
    """
    fn = _COMPRESSORS.get(codec) if type(codec) is not bool else None
    if fn is None:
        raise _unknown_codec(codec)
    if _is_byte_buffer(data):
        return fn(data, level)
    with _byte_memoryview(data) as view:
        return fn(view, level)


def decompress(codec: int, data: bytes | bytearray | memoryview, max_size: int) -> bytes:
    """Decompress a records section written by Kafka (or by :func:`compress`).

    Args:
        codec: a codec id (:data:`NONE` ... :data:`ZSTD`).
        data: the compressed blob; any C-contiguous buffer, e.g. a memoryview into a segment. No
            reference to it, or export of it, survives the call, so the caller may release it.
        max_size: the largest decompressed size accepted (a decompression-bomb guard). Sizes that
            the stream declares are checked against it before anything is allocated, and at most
            about ``min(max_size, actual size)`` bytes are ever allocated for the output.

    Returns:
        The decompressed bytes (``b""`` for an empty ``data``, whatever the codec).

    Raises:
        CorruptRecordError: the blob is malformed or truncated, fails a checksum, has trailing
            garbage, or decompresses to more than ``max_size`` bytes. ``path`` and ``position``
            are None and ``reason`` starts with the codec name.
        ValueError: unknown codec id, or a negative ``max_size``.
        UnsupportedCodecError: the codec's library is not installed.
        Thread-safe.
    """
    fn = _DECOMPRESSORS.get(codec) if type(codec) is not bool else None
    if fn is None:
        raise _unknown_codec(codec)
    if max_size < 0:
        raise ValueError(f"max_size must be >= 0, got {max_size!r}")
    if _is_byte_buffer(data):
        return fn(data, max_size)
    with _byte_memoryview(data) as view:
        return fn(view, max_size)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

_U32_LE = struct.Struct("<I")
_U64_LE = struct.Struct("<Q")
_I32_BE = struct.Struct(">i")


def _unknown_codec(codec: Any) -> ValueError:
    return ValueError(f"unknown compression codec {codec!r}; known codec ids are 0-4 ({', '.join(_NAMES)})")


def _corrupt(codec: int, what: str) -> CorruptRecordError:
    return CorruptRecordError(None, None, f"{_NAMES[codec]}: {what}")


def _too_big(codec: int, max_size: int, declared: int | None = None) -> CorruptRecordError:
    if declared is None:
        return _corrupt(codec, f"decompressed size exceeds max_size = {max_size} bytes")
    return _corrupt(codec, f"declared decompressed size {declared} exceeds max_size = {max_size} bytes")


def _unsupported(codec: int) -> UnsupportedCodecError:
    if codec == LZ4:
        hint = "the 'lz4' package: pip install lz4 (or install logstore with the [lz4] extra)"
    elif codec == SNAPPY:
        hint = "the 'python-snappy' package: pip install python-snappy"
    else:
        hint = "the 'zstandard' package: pip install zstandard"
    return UnsupportedCodecError(f"{_NAMES[codec]} compression requires {hint}")


# The codec functions take bytes, bytearray or a 1-D memoryview of format "B" (what the public
# functions pass them): len() is the size in bytes and indexing gives ints. Every memoryview they
# make of the caller's data is released with `with` before they return or raise: a traceback kept
# alive by the caller (``raise ... from exc``) must not pin an export of the caller's buffer (the
# segment reader releases its view, and an mmap cannot close while exports exist).


def _is_byte_buffer(data: Any) -> bool:
    t = type(data)
    return t is bytes or t is bytearray or (
        t is memoryview and data.format == "B" and data.ndim == 1 and data.c_contiguous
    )


def _byte_memoryview(data: Any) -> memoryview:
    """A new 1-D unsigned-byte memoryview of any C-contiguous buffer (the caller releases it)."""
    view = memoryview(data)
    if view.format == "B" and view.ndim == 1:
        return view
    with view:
        return view.cast("B")  # TypeError for non-contiguous buffers, as the libraries would raise


def _check_no_level(codec: int, level: int | None) -> None:
    if level is not None:
        raise ValueError(f"{_NAMES[codec]} has no compression levels; pass level=None, got {level!r}")


def _check_level(codec: int, level: Any, lo: int, hi: int, extra: tuple[int, ...] = ()) -> int:
    if type(level) is bool or not isinstance(level, int) or not (lo <= level <= hi or level in extra):
        allowed = f"{lo}..{hi}" + "".join(f" or {e}" for e in extra)
        raise ValueError(f"{_NAMES[codec]} compression level must be {allowed}, got {level!r}")
    return int(level)


# ---------------------------------------------------------------------------------------------
# none
# ---------------------------------------------------------------------------------------------


def _compress_none(data: Any, level: int | None) -> bytes:
    _check_no_level(NONE, level)
    return bytes(data)


def _decompress_none(data: Any, max_size: int) -> bytes:
    if len(data) > max_size:
        raise _too_big(NONE, max_size, len(data))
    return bytes(data)


# ---------------------------------------------------------------------------------------------
# gzip
# ---------------------------------------------------------------------------------------------

_GZIP_WBITS = 31  # 16 + MAX_WBITS: gzip wrapper only, 32 KiB window (what Java writes and reads)
_GZIP_DEFAULT_LEVEL = 6  # Deflater.DEFAULT_COMPRESSION (-1) is zlib's level 6


def _compress_gzip(data: Any, level: int | None) -> bytes:
    lvl = _GZIP_DEFAULT_LEVEL if level is None else _check_level(GZIP, level, 1, 9, (-1,))
    return zlib.compress(data, lvl, _GZIP_WBITS)  # one shot, no intermediate copies


def _decompress_gzip(data: Any, max_size: int) -> bytes:
    if not len(data):
        return b""
    parts: list[bytes] = []
    total = 0
    rest: Any = data
    while True:
        d = zlib.decompressobj(_GZIP_WBITS)
        try:
            # max_length bounds the output; CPython grows the result in blocks up to that bound.
            out = d.decompress(rest, min(max_size + 1 - total, sys.maxsize))
        except zlib.error as exc:
            what = "invalid gzip member" if not parts else "invalid data after gzip member"
            raise _corrupt(GZIP, f"{what} ({exc})") from None
        total += len(out)
        if total > max_size:
            raise _too_big(GZIP, max_size)
        if not d.eof:
            raise _corrupt(GZIP, "truncated stream (gzip member has no end)")
        rest = d.unused_data
        if not parts and not rest:
            return out
        parts.append(out)
        if not rest:
            return b"".join(parts)


# ---------------------------------------------------------------------------------------------
# snappy (xerial framing)
# ---------------------------------------------------------------------------------------------

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + (1).to_bytes(4, "big") + (1).to_bytes(4, "big")
_XERIAL_HEADER_SIZE = 16
_XERIAL_MAGIC_HEAD = _I32_BE.unpack(_XERIAL_MAGIC[:4])[0]  # a block length that starts a new header
_XERIAL_BLOCK_SIZE = 32 * 1024  # snappy-java SnappyOutputStream.DEFAULT_BLOCK_SIZE


def _compress_snappy(data: Any, level: int | None) -> bytes:
    _check_no_level(SNAPPY, level)
    compress_raw = _snappy_compress_raw
    if compress_raw is None:
        raise _unsupported(SNAPPY)
    n = len(data)
    if n <= _XERIAL_BLOCK_SIZE:
        if n == 0:
            return _XERIAL_HEADER  # snappy-java writes the header even for an empty stream
        block = compress_raw(data)
        return b"".join((_XERIAL_HEADER, _I32_BE.pack(len(block)), block))
    if type(data) is memoryview:
        return _xerial_encode(compress_raw, data, n)
    with memoryview(data) as mv:
        return _xerial_encode(compress_raw, mv, n)


def _xerial_encode(compress_raw: Callable[[Any], Any], mv: memoryview, n: int) -> bytes:
    parts: list[Any] = [_XERIAL_HEADER]
    append = parts.append
    pack = _I32_BE.pack
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
            raise _corrupt(SNAPPY, "truncated block (incomplete length header)")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 28:
            raise _corrupt(SNAPPY, "invalid block length header (varint longer than 5 bytes)")
    if result > 0xFFFFFFFF:
        raise _corrupt(SNAPPY, "invalid block length header (length >= 2**32)")
    return result


def _snappy_raw(uncompress: Callable[[Any], Any], block: Any) -> Any:
    try:
        return uncompress(block)
    except _SNAPPY_ERRORS as exc:
        raise _corrupt(SNAPPY, f"invalid snappy block ({exc})") from None


def _decompress_snappy(data: Any, max_size: int) -> bytes:
    uncompress = _snappy_uncompress_raw
    if uncompress is None:
        raise _unsupported(SNAPPY)
    buf = data
    n = len(buf)
    if n == 0:
        return b""
    if n < _XERIAL_HEADER_SIZE or buf[:8] != _XERIAL_MAGIC:
        # Not a xerial stream: a plain raw snappy blob, as SnappyInputStream falls back to.
        size = _snappy_length(buf, 0, n)
        if size > max_size:
            raise _too_big(SNAPPY, max_size, size)
        out = _snappy_raw(uncompress, buf)
        return out if type(out) is bytes else bytes(out)

    # Walk the framing first: check every length (and the declared uncompressed sizes against
    # max_size) before decompressing anything.
    blocks: list[tuple[int, int]] = []
    total = 0
    pos = 0
    unpack_from = _I32_BE.unpack_from
    while pos < n:
        if n - pos < 4:
            raise _corrupt(SNAPPY, f"truncated stream ({n - pos} bytes at {pos}; a block length needs 4)")
        length = unpack_from(buf, pos)[0]
        if length == _XERIAL_MAGIC_HEAD or pos == 0:  # a (concatenated) stream header
            if n - pos < _XERIAL_HEADER_SIZE or buf[pos : pos + 8] != _XERIAL_MAGIC:
                raise _corrupt(SNAPPY, f"invalid xerial stream header at {pos}")
            version = unpack_from(buf, pos + 8)[0]
            if version < 1:
                raise _corrupt(SNAPPY, f"unsupported xerial stream version {version} at {pos}")
            pos += _XERIAL_HEADER_SIZE
            continue
        if length <= 0:
            raise _corrupt(SNAPPY, f"invalid block length {length} at {pos}")
        start = pos + 4
        pos = start + length
        if pos > n:
            raise _corrupt(
                SNAPPY, f"truncated stream (block at {start - 4} declares {length} bytes, {n - start} remain)"
            )
        total += _snappy_length(buf, start, pos)
        if total > max_size:
            raise _too_big(SNAPPY, max_size, total)
        blocks.append((start, pos))

    if not blocks:
        return b""
    if type(buf) is memoryview:
        return _xerial_decode(uncompress, buf, blocks)
    with memoryview(buf) as mv:
        return _xerial_decode(uncompress, mv, blocks)


def _xerial_decode(
    uncompress: Callable[[Any], Any], mv: memoryview, blocks: list[tuple[int, int]]
) -> bytes:
    if len(blocks) == 1:
        start, end = blocks[0]
        with mv[start:end] as block:
            out = _snappy_raw(uncompress, block)
        return out if type(out) is bytes else bytes(out)
    parts = []
    for start, end in blocks:
        with mv[start:end] as block:
            parts.append(_snappy_raw(uncompress, block))
    return b"".join(parts)


# ---------------------------------------------------------------------------------------------
# lz4 (frame format)
# ---------------------------------------------------------------------------------------------

_LZ4_MAGIC = 0x184D2204
_LZ4_KAFKA_DEFAULT_LEVEL = 9  # CompressionType.LZ4.defaultLevel(): Kafka uses the fast compressor for it
_LZ4_BLOCK_SIZE = 64 * 1024  # Lz4BlockOutputStream.BLOCKSIZE_64KB
# magic, FLG (version 1, independent blocks), BD (64 KiB), header checksum (xxh32(FLG BD) >> 8)
_LZ4_KAFKA_HEADER = bytes([0x04, 0x22, 0x4D, 0x18, 0x60, 0x40, 0x82])
_LZ4_END_MARK = b"\x00\x00\x00\x00"


def _lz4_module() -> Any:
    mod = _lz4
    if mod is None:
        raise _unsupported(LZ4)
    return mod


def _compress_lz4(data: Any, level: int | None) -> bytes:
    block_compress = _lz4_module().block.compress
    if level is None or level == _LZ4_KAFKA_DEFAULT_LEVEL:
        hc_level = 0  # Kafka's fastCompressor: LZ4_compress_default
    else:
        hc_level = _check_level(LZ4, level, 1, 17)  # Kafka's highCompressor(level): LZ4_compress_HC
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
        return _U32_LE.pack(size | 0x80000000), chunk
    return _U32_LE.pack(len(block)), block


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
        raise _corrupt(LZ4, f"truncated frame header ({n} bytes)")
    magic = _U32_LE.unpack_from(buf, 0)[0]
    if magic != _LZ4_MAGIC:
        raise _corrupt(LZ4, f"bad frame magic {magic:#010x}")
    flg = buf[4]
    bd = buf[5]
    if flg >> 6 != 1:
        raise _corrupt(LZ4, f"unsupported frame version {flg >> 6}")
    if flg & 0x02 or bd & 0x8F:
        raise _corrupt(LZ4, "reserved bits set in frame descriptor")
    block_id = (bd >> 4) & 7
    if block_id < 4:
        raise _corrupt(LZ4, f"invalid block maximum size id {block_id}")
    block_max = 1 << (2 * block_id + 8)
    block_checksum = 4 if flg & 0x10 else 0
    pos = 6
    content_size = -1
    if flg & 0x08:
        if n < pos + 8:
            raise _corrupt(LZ4, "truncated frame header")
        content_size = _U64_LE.unpack_from(buf, pos)[0]
        pos += 8
    if flg & 0x01:
        pos += 4  # dictionary id
    pos += 1  # header checksum (verified by the library)
    bound = 0
    unpack_from = _U32_LE.unpack_from
    while True:
        if n < pos + 4:
            raise _corrupt(LZ4, "truncated frame (missing block header or end mark)")
        word = unpack_from(buf, pos)[0]
        pos += 4
        if word == 0:
            break
        size = word & 0x7FFFFFFF
        if size > block_max:
            raise _corrupt(LZ4, f"block of {size} bytes exceeds the frame's {block_max}-byte maximum")
        pos += size + block_checksum
        if pos > n:
            raise _corrupt(LZ4, "truncated frame (block runs past the end)")
        bound += size if word & 0x80000000 else block_max
    if flg & 0x04:
        pos += 4  # content checksum
        if pos > n:
            raise _corrupt(LZ4, "truncated frame (missing content checksum)")
    if content_size >= 0:
        if content_size > bound:
            raise _corrupt(LZ4, f"declared content size {content_size} is more than its blocks hold ({bound})")
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


def _decompress_lz4(data: Any, max_size: int) -> bytes:
    lz4f = _lz4_module().frame
    buf = data
    n = len(buf)
    if n == 0:
        return b""
    end, bound, content_size = _lz4_frame_bound(buf, n)
    if end != n:
        raise _corrupt(LZ4, f"{n - end} bytes of trailing data after the frame")
    if content_size > max_size:
        raise _too_big(LZ4, max_size, content_size)
    # decompress_chunk allocates max_length up front: size it from the frame, never more than
    # max_size + 1 (one byte more than allowed tells a bomb from an exact fit).
    limit = min(bound, max_size) + 1
    ctx = _lz4_context(lz4f)  # reset before every use, so a failed call leaves no state behind
    try:
        out, consumed, eof = lz4f.decompress_chunk(ctx, buf, max_length=limit)
    except (RuntimeError, ValueError) as exc:
        raise _corrupt(LZ4, f"invalid frame ({exc})") from None
    if len(out) > max_size:
        raise _too_big(LZ4, max_size)
    if not eof or consumed != n:
        raise _corrupt(LZ4, "frame did not decode to its end mark (corrupt block data)")
    return out


# ---------------------------------------------------------------------------------------------
# zstd
# ---------------------------------------------------------------------------------------------

_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE_MASK = 0xFFFFFFF0
_ZSTD_SKIPPABLE_MAGIC = 0x184D2A50
_ZSTD_BLOCK_MAX = 128 * 1024  # no block decompresses to more than this
_ZSTD_DEFAULT_LEVEL = 3  # Kafka's CompressionType.ZSTD.defaultLevel()
_ZSTD_MIN_LEVEL = -(1 << 17)  # ZSTD_minCLevel(), Kafka's minimum
_ZSTD_MAX_LEVEL = 22
_DID_SIZES = (0, 1, 2, 4)
_FCS_SIZES = (0, 2, 4, 8)


def _zstd_module() -> Any:
    mod = _zstd
    if mod is None:
        raise _unsupported(ZSTD)
    return mod


def _compress_zstd(data: Any, level: int | None) -> bytes:
    zstd = _zstd_module()
    if level is None:
        lvl = _ZSTD_DEFAULT_LEVEL
    else:
        lvl = _check_level(ZSTD, level, _ZSTD_MIN_LEVEL, _ZSTD_MAX_LEVEL)
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
    u32 = _U32_LE.unpack_from
    while pos < n:
        if n - pos < 4:
            raise _corrupt(ZSTD, f"truncated stream ({n - pos} trailing bytes at {pos})")
        magic = u32(buf, pos)[0]
        if magic != _ZSTD_MAGIC:
            if magic & _ZSTD_SKIPPABLE_MASK == _ZSTD_SKIPPABLE_MAGIC:
                if n - pos < 8:
                    raise _corrupt(ZSTD, "truncated skippable frame")
                pos += 8 + u32(buf, pos + 4)[0]
                if pos > n:
                    raise _corrupt(ZSTD, "truncated skippable frame")
                continue
            raise _corrupt(ZSTD, f"bad frame magic {magic:#010x} at {pos}")
        if n - pos < 6:
            raise _corrupt(ZSTD, "truncated frame header")
        fhd = buf[pos + 4]
        single_segment = (fhd >> 5) & 1
        fcs_flag = fhd >> 6
        fcs_size = _FCS_SIZES[fcs_flag] if fcs_flag or not single_segment else 1
        p = pos + 5 + (0 if single_segment else 1) + _DID_SIZES[fhd & 3]
        header_end = p + fcs_size
        if header_end > n:
            raise _corrupt(ZSTD, "truncated frame header")
        if fcs_size == 0:
            content_size = -1
        elif fcs_size == 8:
            content_size = _U64_LE.unpack_from(buf, p)[0]
        else:
            content_size = int.from_bytes(buf[p:header_end], "little") + (256 if fcs_size == 2 else 0)
        p = header_end
        bound = 0
        while True:
            if n - p < 3:
                raise _corrupt(ZSTD, "truncated frame (missing block header)")
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
                raise _corrupt(ZSTD, f"reserved block type at {p - 3}")
            if p > n:
                raise _corrupt(ZSTD, "truncated frame (block runs past the end)")
            if bh & 1:  # last block
                break
        if (fhd >> 2) & 1:
            p += 4  # content checksum
            if p > n:
                raise _corrupt(ZSTD, "truncated frame (missing content checksum)")
        if content_size > bound:
            raise _corrupt(ZSTD, f"declared content size {content_size} is more than its blocks hold ({bound})")
        frames.append((pos, p, content_size, bound))
        pos = p
    return frames


def _zstd_decompressor(zstd: Any) -> Any:
    try:
        return _tls.zstd_dctx
    except AttributeError:
        dctx = _tls.zstd_dctx = zstd.ZstdDecompressor()
        return dctx


def _zstd_frame(dctx: Any, frame: Any, content_size: int, bound: int, budget: int, max_size: int) -> bytes:
    """Decompress one complete frame (already walked) into at most `budget` bytes."""
    if content_size > budget:
        raise _too_big(ZSTD, max_size, content_size + max_size - budget)
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
    except _ZstdError as exc:
        raise _corrupt(ZSTD, f"invalid frame ({exc})") from None
    if len(out) > budget:
        raise _too_big(ZSTD, max_size)
    if len(out) > bound or 0 <= content_size != len(out):
        raise _corrupt(ZSTD, "frame decoded to more data than its header or blocks declare")
    return out


def _decompress_zstd(data: Any, max_size: int) -> bytes:
    zstd = _zstd_module()
    n = len(data)
    if n == 0:
        return b""
    frames = _zstd_frames(data, n)
    dctx = _zstd_decompressor(zstd)
    if len(frames) == 1 and frames[0][0] == 0 and frames[0][1] == n:
        _, _, content_size, bound = frames[0]
        return _zstd_frame(dctx, data, content_size, bound, max_size, max_size)
    if type(data) is memoryview:
        return _zstd_decode_frames(dctx, data, frames, max_size)
    with memoryview(data) as mv:
        return _zstd_decode_frames(dctx, mv, frames, max_size)


def _zstd_decode_frames(
    dctx: Any, mv: memoryview, frames: list[tuple[int, int, int, int]], max_size: int
) -> bytes:
    parts = []
    total = 0
    for start, end, content_size, bound in frames:
        with mv[start:end] as frame:
            part = _zstd_frame(dctx, frame, content_size, bound, max_size - total, max_size)
        total += len(part)
        parts.append(part)
    return b"".join(parts)


# ---------------------------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------------------------

_COMPRESSORS: dict[int, Callable[[Any, int | None], bytes]] = {
    NONE: _compress_none,
    GZIP: _compress_gzip,
    SNAPPY: _compress_snappy,
    LZ4: _compress_lz4,
    ZSTD: _compress_zstd,
}

_DECOMPRESSORS: dict[int, Callable[[Any, int], bytes]] = {
    NONE: _decompress_none,
    GZIP: _decompress_gzip,
    SNAPPY: _decompress_snappy,
    LZ4: _decompress_lz4,
    ZSTD: _decompress_zstd,
}
