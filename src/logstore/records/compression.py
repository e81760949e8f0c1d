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
    The xerial snappy-java stream of ``SnappyOutputStream`` (:mod:`logstore.records.xerial`); reading
    also accepts what ``SnappyInputStream`` does, plain raw snappy blobs included.
lz4
    The LZ4 frame format exactly as ``Lz4BlockOutputStream`` writes it; reading accepts any valid
    frame (:mod:`logstore.records.lz4frame`). With the same lz4 C library the bytes equal Kafka's. Needs
    the ``lz4`` package (a dependency, as the other codecs' are); should it be missing, LZ4 raises
    :class:`~logstore.errors.UnsupportedCodecError`.
zstd
    A single zstd frame at level 3 (Kafka's default) with the content size in its header; reading
    accepts any frames Kafka's reader does (:mod:`logstore.records.zstdframe`).

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

import sys
import zlib
from typing import Any, Callable

from . import lz4frame
from . import xerial
from . import zstdframe
from .codecbase import GZIP, LZ4, NONE, SNAPPY, ZSTD
from .codecbase import NAMES as _NAMES
from .codecbase import check_level as _check_level
from .codecbase import check_no_level as _check_no_level
from .codecbase import corrupt as _corrupt
from .codecbase import too_big as _too_big
from ..errors import UnsupportedCodecError

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

# The codec ids NONE ... ZSTD (attributes bits 0-2) come from the C header through codecbase.

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

def _unknown_codec(codec: Any) -> ValueError:
    return ValueError(f"unknown compression codec {codec!r}; known codec ids are 0-4 ({', '.join(_NAMES)})")


def _unsupported(codec: int) -> UnsupportedCodecError:
    if codec == LZ4:
        hint = "the 'lz4' package, a dependency of logstore: pip install lz4"
    elif codec == SNAPPY:
        hint = "the 'python-snappy' package: pip install python-snappy"
    else:
        hint = "the 'zstandard' package: pip install zstandard"
    return UnsupportedCodecError(f"{_NAMES[codec]} compression requires {hint}")


# The codec functions take bytes, bytearray or a 1-D memoryview of format "B", made here; see
# codecbase for what they may do with it.


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
# snappy, lz4, zstd: the framing is in xerial.py, lz4frame.py and zstdframe.py; the libraries
# are looked up here at call time, so that rebinding the module attributes takes effect.
# ---------------------------------------------------------------------------------------------


def _compress_snappy(data: Any, level: int | None) -> bytes:
    _check_no_level(SNAPPY, level)
    compress_raw = _snappy_compress_raw
    if compress_raw is None:
        raise _unsupported(SNAPPY)
    return xerial.compress(compress_raw, data)


def _decompress_snappy(data: Any, max_size: int) -> bytes:
    uncompress = _snappy_uncompress_raw
    if uncompress is None:
        raise _unsupported(SNAPPY)
    return xerial.decompress(uncompress, _SNAPPY_ERRORS, data, max_size)


def _lz4_module() -> Any:
    mod = _lz4
    if mod is None:
        raise _unsupported(LZ4)
    return mod


def _compress_lz4(data: Any, level: int | None) -> bytes:
    return lz4frame.compress(_lz4_module(), data, level)


def _decompress_lz4(data: Any, max_size: int) -> bytes:
    return lz4frame.decompress(_lz4_module(), data, max_size)


def _zstd_module() -> Any:
    mod = _zstd
    if mod is None:
        raise _unsupported(ZSTD)
    return mod


def _compress_zstd(data: Any, level: int | None) -> bytes:
    return zstdframe.compress(_zstd_module(), data, level)


def _decompress_zstd(data: Any, max_size: int) -> bytes:
    return zstdframe.decompress(_zstd_module(), data, max_size)


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
