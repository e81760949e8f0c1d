"""Tests for logstore.records.compression: Kafka-compatible codecs, framing bytes, bounds and errors."""

from __future__ import annotations

import array
import gzip
import importlib
import io
import json
import mmap
import os
import pathlib
import random
import re
import struct
import threading
import tracemalloc
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest

from logstore.records import compression as c
from logstore.errors import CorruptRecordError, LogstoreError, UnsupportedCodecError

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

CODECS = sorted(c.available_codecs())
COMPRESSED = [x for x in CODECS if x != c.NONE]
MiB = 1 << 20
HEADER = pathlib.Path(__file__).resolve().parents[2] / "src" / "logstore" / "_native" / "logstore.h"
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def records(n: int, seed: int = 0) -> bytes:
    """JSON-like records, compressible the way real payloads are (not just repeated bytes)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        out.append(
            json.dumps(
                {
                    "id": i,
                    "user": f"user-{rnd.randrange(100000):06d}",
                    "event": rnd.choice(["click", "view", "purchase", "signup", "logout"]),
                    "ts": 1700000000000 + rnd.randrange(10**9),
                    "amount": round(rnd.random() * 1000, 2),
                    "tags": rnd.sample(["a", "b", "c", "d", "e", "f", "g"], 3),
                    "session": rnd.randbytes(8).hex(),
                }
            )
        )
    return "\n".join(out).encode()


def payload(size: int, kind: str) -> bytes:
    if kind == "random":
        return random.Random(size).randbytes(size)
    if kind == "zeros":
        return bytes(size)
    base = records(size // 150 + 2, seed=size)
    return (base * (size // len(base) + 1))[:size]


def need(codec: int) -> None:
    if codec not in c.available_codecs():
        pytest.skip(f"{c.codec_name(codec)} library not installed")


# --------------------------------------------------------------------------------------------
# constants, names, availability
# --------------------------------------------------------------------------------------------


def test_codec_ids_match_native_header_text():
    text = HEADER.read_text()
    defined = {m[1]: int(m[2]) for m in re.finditer(r"#define\s+LS_COMPRESSION_(\w+)\s+(\d+)", text)}
    assert defined == {"NONE": c.NONE, "GZIP": c.GZIP, "SNAPPY": c.SNAPPY, "LZ4": c.LZ4, "ZSTD": c.ZSTD}
    mask = re.search(r"#define\s+LS_ATTR_COMPRESSION_MASK\s+(\d+)", text)
    assert mask and all(v & ~int(mask[1]) == 0 for v in defined.values())


def test_codec_ids_match_compiled_native_module():
    lib = None
    for name in ("logstore._native", "logstore._native._lib"):
        try:
            lib = getattr(importlib.import_module(name), "lib", None)
        except ImportError:
            continue
        if lib is not None:
            break
    if lib is None:
        pytest.skip("logstore._native is not built")
    assert (lib.LS_COMPRESSION_NONE, lib.LS_COMPRESSION_GZIP, lib.LS_COMPRESSION_SNAPPY,
            lib.LS_COMPRESSION_LZ4, lib.LS_COMPRESSION_ZSTD) == (c.NONE, c.GZIP, c.SNAPPY, c.LZ4, c.ZSTD)


def test_codec_names():
    assert c.CODEC_NAMES == {"none": 0, "uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
    assert [c.codec_name(i) for i in range(5)] == ["none", "gzip", "snappy", "lz4", "zstd"]
    for name, codec in c.CODEC_NAMES.items():
        assert c.codec_from_name(name, require_available=False) == codec
        assert c.codec_from_name(name.upper(), require_available=False) == codec
    assert c.codec_from_name(None) == c.NONE
    assert c.codec_from_name(" Gzip ") == c.GZIP
    assert c.codec_from_name(1) == c.GZIP


@pytest.mark.parametrize("bad", ["brotli", "", "producer", "gzip2", 5, -1, 7, True, 1.0, b"gzip"])
def test_unknown_codec_name_raises_value_error(bad):
    with pytest.raises(ValueError) as exc:
        c.codec_from_name(bad)
    message = str(exc.value)
    assert repr(bad) in message
    if isinstance(bad, str):
        for name in ("none", "uncompressed", "gzip", "snappy", "lz4", "zstd"):
            assert name in message


@pytest.mark.parametrize("bad", [5, -1, 99, True])
def test_unknown_codec_id(bad):
    with pytest.raises(ValueError):
        c.codec_name(bad)
    with pytest.raises(ValueError, match="unknown compression codec"):
        c.compress(bad, b"abc")
    with pytest.raises(ValueError, match="unknown compression codec"):
        c.decompress(bad, b"abc", 100)


def test_negative_max_size():
    with pytest.raises(ValueError):
        c.decompress(c.GZIP, c.compress(c.GZIP, b"x"), -1)


def test_available_codecs():
    avail = c.available_codecs()
    assert isinstance(avail, frozenset)
    assert {c.NONE, c.GZIP} <= avail <= {0, 1, 2, 3, 4}


def test_lz4_missing(monkeypatch):
    monkeypatch.setattr(c, "_lz4", None)
    assert c.LZ4 not in c.available_codecs()
    with pytest.raises(UnsupportedCodecError, match="pip install lz4"):
        c.compress(c.LZ4, b"data")
    with pytest.raises(UnsupportedCodecError, match="lz4"):
        c.decompress(c.LZ4, b"\x04\x22\x4d\x18\x60\x40\x82\x00\x00\x00\x00", 100)
    with pytest.raises(UnsupportedCodecError):
        c.codec_from_name("lz4")
    assert c.codec_from_name("lz4", require_available=False) == c.LZ4
    assert issubclass(UnsupportedCodecError, LogstoreError)
    c.decompress(c.GZIP, c.compress(c.GZIP, b"still fine"), 100)


def test_snappy_and_zstd_missing(monkeypatch):
    monkeypatch.setattr(c, "_snappy_compress_raw", None)
    monkeypatch.setattr(c, "_snappy_uncompress_raw", None)
    monkeypatch.setattr(c, "_zstd", None)
    assert c.available_codecs().isdisjoint({c.SNAPPY, c.ZSTD})
    for codec in (c.SNAPPY, c.ZSTD):
        with pytest.raises(UnsupportedCodecError, match="pip install"):
            c.compress(codec, b"x")
        with pytest.raises(UnsupportedCodecError):
            c.decompress(codec, b"x", 10)


# --------------------------------------------------------------------------------------------
# round trips
# --------------------------------------------------------------------------------------------

SIZES = [0, 1, 2, 100, 4096, 32767, 32768, 32769, 65535, 65536, 65537, 100000]


@pytest.mark.parametrize("codec", CODECS, ids=c.codec_name)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["random", "records", "zeros"])
def test_round_trip(codec, size, kind):
    data = payload(size, kind)
    blob = c.compress(codec, data)
    assert type(blob) is bytes
    out = c.decompress(codec, blob, size)
    assert type(out) is bytes and out == data
    if size:
        with pytest.raises(CorruptRecordError, match="max_size"):
            c.decompress(codec, blob, size - 1)


@pytest.mark.parametrize("codec", CODECS, ids=c.codec_name)
def test_input_buffer_types(codec):
    data = payload(70001, "records")
    expected = c.compress(codec, data)
    big = bytearray(b"#" * 13 + data + b"#" * 7)
    inputs = [bytearray(data), memoryview(data), memoryview(big)[13 : 13 + len(data)]]
    for item in inputs:
        blob = c.compress(codec, item)
        assert c.decompress(codec, blob, len(data)) == data
        if codec != c.GZIP:  # deterministic given the same bytes
            assert blob == expected
    framed = bytearray(b"\0" * 5 + expected + b"\0" * 3)
    assert c.decompress(codec, memoryview(framed)[5 : 5 + len(expected)], len(data)) == data
    assert c.decompress(codec, bytearray(expected), len(data)) == data
    # Multi-byte item formats are read as their bytes.
    words = array.array("I", range(1000))
    raw = words.tobytes()
    blob = c.compress(codec, memoryview(words))
    assert c.decompress(codec, blob, len(raw)) == raw


def test_none_codec_is_identity():
    data = b"plain records"
    assert c.compress(c.NONE, data) is data
    assert c.compress(c.NONE, memoryview(data)) == data
    assert c.decompress(c.NONE, bytearray(data), len(data)) == data
    with pytest.raises(CorruptRecordError, match="none: .*max_size"):
        c.decompress(c.NONE, data, len(data) - 1)


@pytest.mark.parametrize("codec", CODECS, ids=c.codec_name)
def test_empty_input_decompresses_to_empty(codec):
    # Kafka's cleaner keeps empty batches (no records section) that keep their codec bits.
    assert c.decompress(codec, b"", 0) == b""
    assert c.decompress(codec, memoryview(b""), 0) == b""


@FAST
@given(data=st.binary(max_size=80000), codec=st.sampled_from(CODECS))
def test_round_trip_property_random(data, codec):
    assert c.decompress(codec, c.compress(codec, data), len(data)) == data


@FAST
@given(
    chunks=st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=20),
    reps=st.integers(1, 3000),
    codec=st.sampled_from(CODECS),
)
def test_round_trip_property_compressible(chunks, reps, codec):
    rnd = random.Random(reps)
    data = b"".join(rnd.choice(chunks) for _ in range(reps))
    blob = c.compress(codec, data)
    assert c.decompress(codec, blob, len(data)) == data


LEVELS = {
    c.GZIP: ([None, -1, 1, 5, 6, 9], [0, 10, -2, True, 3.0, "6"]),
    c.LZ4: ([None, 1, 2, 3, 9, 12, 17], [0, 18, -1, True, "9"]),
    c.ZSTD: ([None, -131072, -5, 1, 3, 19, 22], [23, -131073, True, 3.5]),
    c.SNAPPY: ([None], [0, 1, 6]),
    c.NONE: ([None], [0, 1]),
}


@pytest.mark.parametrize("codec", CODECS, ids=c.codec_name)
def test_levels(codec):
    good, bad = LEVELS[codec]
    data = payload(100000, "records")
    for level in good:
        assert c.decompress(codec, c.compress(codec, data, level), len(data)) == data
    for level in bad:
        with pytest.raises(ValueError):
            c.compress(codec, data, level)


def test_default_levels_match_kafka():
    data = payload(100000, "records")
    assert c.compress(c.GZIP, data) == c.compress(c.GZIP, data, 6) == c.compress(c.GZIP, data, -1)
    if c.ZSTD in CODECS:
        assert c.compress(c.ZSTD, data) == c.compress(c.ZSTD, data, 3)
    if c.LZ4 in CODECS:
        # Kafka's Lz4BlockOutputStream uses the fast compressor for its default level 9.
        assert c.compress(c.LZ4, data) == c.compress(c.LZ4, data, 9)
        assert c.compress(c.LZ4, data, 10) != c.compress(c.LZ4, data)


def test_concurrent_use_is_thread_safe():
    jobs = []
    for i in range(240):
        codec = CODECS[i % len(CODECS)]
        level = {c.ZSTD: [None, 1, 5][i % 3], c.LZ4: [None, 4][i % 2], c.GZIP: [None, 1][i % 2]}.get(codec)
        jobs.append((codec, level, payload(1000 + 997 * i, "records" if i % 2 else "random")))
    start = threading.Barrier(8)

    def work(job):
        codec, level, data = job
        blob = c.compress(codec, data, level)
        return c.decompress(codec, blob, len(data)) == data

    def runner(chunk):
        start.wait()
        return all(work(j) for j in chunk)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(runner, [jobs[k::8] for k in range(8)]))
    assert all(results)


# --------------------------------------------------------------------------------------------
# gzip specifics
# --------------------------------------------------------------------------------------------


def test_gzip_format():
    data = payload(50000, "records")
    blob = c.compress(c.GZIP, data)
    assert blob[:4] == b"\x1f\x8b\x08\x00"  # gzip magic, deflate, no flags (like GZIPOutputStream)
    assert blob == zlib.compress(data, 6, 31)
    assert gzip.decompress(blob) == data
    assert struct.unpack("<II", blob[-8:]) == (zlib.crc32(data), len(data))


def test_gzip_reads_other_writers_and_multiple_members():
    data = payload(40000, "records")
    # Header variants Java and other writers produce: mtime, file name, OS byte 0 / 255.
    buf = io.BytesIO()
    with gzip.GzipFile(filename="records.bin", mode="wb", fileobj=buf, mtime=1700000000) as f:
        f.write(data)
    named = buf.getvalue()
    java_like = bytearray(c.compress(c.GZIP, data))
    java_like[9] = 0
    jdk16 = bytearray(java_like)
    jdk16[9] = 255
    for blob in (named, bytes(java_like), bytes(jdk16)):
        assert c.decompress(c.GZIP, blob, len(data)) == data
    members = c.compress(c.GZIP, data[:1000]) + c.compress(c.GZIP, b"") + c.compress(c.GZIP, data[1000:])
    assert c.decompress(c.GZIP, members, len(data)) == data
    with pytest.raises(CorruptRecordError, match="max_size"):
        c.decompress(c.GZIP, members, len(data) - 1)


# --------------------------------------------------------------------------------------------
# snappy specifics: xerial framing
# --------------------------------------------------------------------------------------------

XERIAL_HEADER = b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x01"


def xerial_blocks(blob: bytes) -> list[bytes]:
    assert blob[:16] == XERIAL_HEADER
    pos, blocks = 16, []
    while pos < len(blob):
        (length,) = struct.unpack_from(">i", blob, pos)
        blocks.append(blob[pos + 4 : pos + 4 + length])
        pos += 4 + length
    assert pos == len(blob)
    return blocks


def test_snappy_xerial_framing_exact_bytes():
    need(c.SNAPPY)
    snappy = pytest.importorskip("snappy")
    data = payload(70000, "records")
    blob = c.compress(c.SNAPPY, data)
    assert blob[:16] == bytes([0x82, 0x53, 0x4E, 0x41, 0x50, 0x50, 0x59, 0x00, 0, 0, 0, 1, 0, 0, 0, 1])
    blocks = xerial_blocks(blob)
    slices = [data[0:32768], data[32768:65536], data[65536:70000]]
    assert len(blocks) == 3
    for block, chunk in zip(blocks, slices):
        assert snappy.uncompress(block) == chunk  # each block is raw snappy of one 32 KiB chunk
        assert block == snappy.compress(chunk)
    expected = XERIAL_HEADER + b"".join(struct.pack(">i", len(b)) + b for b in blocks)
    assert blob == expected
    assert c.compress(c.SNAPPY, b"") == XERIAL_HEADER  # snappy-java writes the header even when empty
    assert c.decompress(c.SNAPPY, XERIAL_HEADER, 0) == b""


def test_snappy_reads_raw_snappy():
    need(c.SNAPPY)
    snappy = pytest.importorskip("snappy")
    for data in (b"", b"x", payload(15, "random"), payload(100000, "records"), payload(5000, "random")):
        raw = snappy.compress(data)
        assert c.decompress(c.SNAPPY, raw, len(data)) == data
        if data:
            with pytest.raises(CorruptRecordError, match="max_size"):
                c.decompress(c.SNAPPY, raw, len(data) - 1)


def test_snappy_reads_concatenated_and_other_version_streams():
    need(c.SNAPPY)
    a, b = payload(40000, "records"), payload(1000, "random")
    joined = c.compress(c.SNAPPY, a) + c.compress(c.SNAPPY, b)
    assert c.decompress(c.SNAPPY, joined, len(a) + len(b)) == a + b
    # Some producers (redpanda) write the version fields little-endian; snappy-java only
    # rejects versions < 1.
    le = bytearray(c.compress(c.SNAPPY, a))
    le[8:16] = b"\x01\x00\x00\x00\x01\x00\x00\x00"
    assert c.decompress(c.SNAPPY, bytes(le), len(a)) == a
    v0 = bytearray(le)
    v0[8:12] = b"\x00\x00\x00\x00"
    with pytest.raises(CorruptRecordError, match="snappy: unsupported xerial stream version 0"):
        c.decompress(c.SNAPPY, bytes(v0), len(a))


def test_snappy_python_snappy_backend(monkeypatch):
    snappy = pytest.importorskip("snappy")
    monkeypatch.setattr(c, "_snappy_compress_raw", snappy.compress)
    monkeypatch.setattr(c, "_snappy_uncompress_raw", snappy.uncompress)
    monkeypatch.setattr(c, "_SNAPPY_ERRORS", (snappy.UncompressError,))
    data = payload(100000, "records")
    blob = c.compress(c.SNAPPY, memoryview(data))
    assert xerial_blocks(blob)
    assert c.decompress(c.SNAPPY, blob, len(data)) == data
    bad = bytearray(blob)
    bad[40:60] = b"\xff" * 20
    with pytest.raises(CorruptRecordError, match="^.*snappy: "):
        c.decompress(c.SNAPPY, bytes(bad), len(data))


# --------------------------------------------------------------------------------------------
# lz4 specifics: Kafka's frame layout
# --------------------------------------------------------------------------------------------


def lz4_frame_blocks(blob: bytes) -> list[tuple[bool, bytes]]:
    pos, blocks = 7, []
    while True:
        (word,) = struct.unpack_from("<I", blob, pos)
        pos += 4
        if word == 0:
            break
        size = word & 0x7FFFFFFF
        blocks.append((bool(word & 0x80000000), blob[pos : pos + size]))
        pos += size
    assert pos == len(blob)  # no content checksum after the end mark
    return blocks


def test_lz4_frame_matches_kafka_layout():
    need(c.LZ4)
    lz4_block = pytest.importorskip("lz4.block")
    samples = (payload(200000, "records"), payload(150000, "random"), payload(65536, "zeros"), b"", b"abc")
    for data in samples:
        blob = c.compress(c.LZ4, data)
        # magic, FLG = version 1 + independent blocks, BD = 64 KiB, header checksum
        assert blob[:7] == bytes([0x04, 0x22, 0x4D, 0x18, 0x60, 0x40, 0x82])
        try:
            import xxhash

            assert blob[6] == (xxhash.xxh32(blob[4:6]).intdigest() >> 8) & 0xFF
        except ImportError:
            pass
        # Lz4BlockOutputStream: 64 KiB chunks, each LZ4-compressed on its own (fast compressor),
        # stored raw with the high bit set when compression does not make it smaller.
        expected = []
        for off in range(0, len(data), 65536):
            chunk = data[off : off + 65536]
            packed = lz4_block.compress(chunk, store_size=False)
            expected.append((True, chunk) if len(packed) >= len(chunk) else (False, packed))
        assert lz4_frame_blocks(blob) == expected
        assert c.decompress(c.LZ4, blob, len(data)) == data
        # Other levels: highCompressor(level), i.e. LZ4_compress_HC on each chunk.
        hc = c.compress(c.LZ4, data, 10)
        assert hc[:7] == blob[:7]
        expected = []
        for off in range(0, len(data), 65536):
            chunk = data[off : off + 65536]
            packed = lz4_block.compress(chunk, mode="high_compression", compression=10, store_size=False)
            expected.append((True, chunk) if len(packed) >= len(chunk) else (False, packed))
        assert lz4_frame_blocks(hc) == expected


def test_lz4_reads_frames_with_content_size_and_checksums():
    need(c.LZ4)
    lz4f = pytest.importorskip("lz4.frame")
    data = payload(300000, "records")
    for kwargs in (
        {},
        {"store_size": False, "block_linked": True},
        {"content_checksum": True, "block_checksum": True},
        {"block_size": lz4f.BLOCKSIZE_MAX4MB, "store_size": False},
        {"block_size": lz4f.BLOCKSIZE_MAX1MB, "compression_level": 9},
    ):
        blob = lz4f.compress(data, **kwargs)
        assert c.decompress(c.LZ4, blob, len(data)) == data, kwargs
        with pytest.raises(CorruptRecordError, match="max_size"):
            c.decompress(c.LZ4, blob, len(data) - 1)


# --------------------------------------------------------------------------------------------
# zstd specifics
# --------------------------------------------------------------------------------------------


def test_zstd_frame_and_kafka_style_frames():
    need(c.ZSTD)
    zstandard = pytest.importorskip("zstandard")
    data = payload(300000, "records")
    blob = c.compress(c.ZSTD, data)
    assert blob[:4] == b"\x28\xb5\x2f\xfd"
    assert zstandard.frame_content_size(blob) == len(data)
    assert blob == zstandard.ZstdCompressor(level=3).compress(data)
    # Kafka's zstd-jni streaming writer: no content size, written in pieces.
    cctx = zstandard.ZstdCompressor(level=3, write_content_size=False)
    out = io.BytesIO()
    with cctx.stream_writer(out, closefd=False) as w:
        for off in range(0, len(data), 16384):
            w.write(data[off : off + 16384])
    streamed = out.getvalue()
    assert zstandard.frame_content_size(streamed) == -1
    checksummed = zstandard.ZstdCompressor(level=1, write_checksum=True, write_content_size=False)
    checksummed = checksummed.compress(data)
    empty_no_size = zstandard.ZstdCompressor(write_content_size=False).compress(b"")
    for variant in (streamed, checksummed):
        assert c.decompress(c.ZSTD, variant, len(data)) == data
        assert c.decompress(c.ZSTD, variant, 10**12) == data
        with pytest.raises(CorruptRecordError, match="max_size"):
            c.decompress(c.ZSTD, variant, len(data) - 1)
    assert c.decompress(c.ZSTD, empty_no_size, 0) == b""
    assert c.decompress(c.ZSTD, c.compress(c.ZSTD, b""), 0) == b""
    # Concatenated frames and skippable frames, as ZSTD_decompressStream reads them.
    skippable = struct.pack("<II", 0x184D2A53, 5) + b"12345"
    multi = c.compress(c.ZSTD, data[:1000]) + skippable + streamed + empty_no_size
    assert c.decompress(c.ZSTD, multi, len(data) + 1000) == data[:1000] + data
    with pytest.raises(CorruptRecordError, match="max_size"):
        c.decompress(c.ZSTD, multi, len(data) + 999)


# --------------------------------------------------------------------------------------------
# interop with kafka-python's codec module
# --------------------------------------------------------------------------------------------

kafka_codec = pytest.importorskip("kafka.codec")
KP = {
    c.GZIP: ("gzip_encode", "gzip_decode", "has_gzip"),
    c.SNAPPY: ("snappy_encode", "snappy_decode", "has_snappy"),
    c.LZ4: ("lz4_encode", "lz4_decode", "has_lz4"),
    c.ZSTD: ("zstd_encode", "zstd_decode", "has_zstd"),
}


def kp(codec):
    need(codec)
    enc, dec, has = KP[codec]
    usable = all(callable(getattr(kafka_codec, n, None)) for n in (enc, dec, has))
    if not usable or not getattr(kafka_codec, has)():
        pytest.skip(f"kafka-python has no usable {c.codec_name(codec)} codec")
    return getattr(kafka_codec, enc), getattr(kafka_codec, dec)


@pytest.mark.parametrize("codec", COMPRESSED, ids=c.codec_name)
@pytest.mark.parametrize("size", [1, 1000, 32768, 70000, 200000])
def test_kafka_python_interop(codec, size):
    encode, decode = kp(codec)
    for kind in ("records", "random"):
        data = payload(size, kind)
        assert c.decompress(codec, encode(data), len(data)) == data
        assert decode(c.compress(codec, data)) == data


def test_kafka_python_snappy_framing_is_identical():
    encode, _ = kp(c.SNAPPY)
    for size in (1, 32768, 70000, 200001):
        data = payload(size, "records")
        ours = c.compress(c.SNAPPY, data)
        assert ours == encode(data, xerial_compatible=True, xerial_blocksize=32 * 1024)


# --------------------------------------------------------------------------------------------
# max_size: bombs and hostile declared sizes
# --------------------------------------------------------------------------------------------


def bombs():
    zeros = bytes(10 * MiB)
    out = [(codec, c.compress(codec, zeros)) for codec in COMPRESSED]
    if c.ZSTD in CODECS:
        import zstandard

        out.append((c.ZSTD, zstandard.ZstdCompressor(write_content_size=False).compress(zeros)))
    if c.LZ4 in CODECS:
        import lz4.frame

        out.append((c.LZ4, lz4.frame.compress(zeros)))  # with content size
    if c.SNAPPY in CODECS:
        import snappy

        out.append((c.SNAPPY, snappy.compress(zeros)))  # raw snappy
    out.append((c.GZIP, c.compress(c.GZIP, zeros[:MiB]) + c.compress(c.GZIP, zeros[:MiB])))
    return out


@pytest.mark.parametrize("codec,blob", bombs(), ids=lambda v: c.codec_name(v) if isinstance(v, int) else "")
def test_decompression_bomb_is_rejected_without_big_allocations(codec, blob):
    assert len(blob) < MiB
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        with pytest.raises(CorruptRecordError, match=f"{c.codec_name(codec)}: .*max_size = {MiB}"):
            c.decompress(codec, blob, MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * MiB


def test_hostile_declared_sizes_fail_before_allocating():
    cases = []
    if c.SNAPPY in CODECS:
        cases += [
            (c.SNAPPY, b"\xff\xff\xff\xff\x0f" + b"\x00" * 30),  # raw: 4 GiB declared
            (c.SNAPPY, XERIAL_HEADER + struct.pack(">i", 6) + b"\xfe\xff\xff\xff\x0f\x00"),
        ]
    if c.LZ4 in CODECS:
        header = bytes([0x04, 0x22, 0x4D, 0x18, 0x68, 0x40]) + struct.pack("<Q", 1 << 40)
        cases.append((c.LZ4, header + b"\x00" + struct.pack("<I", 0x80000000 | 1) + b"x" * 1 + b"\0" * 4))
    if c.ZSTD in CODECS:
        # single-segment frame declaring 2**40 bytes with one RLE block of 2**20 bytes
        frame = b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", 1 << 40)
        frame += ((1 << 20 << 3) | (1 << 1) | 1).to_bytes(3, "little") + b"\x00"
        cases.append((c.ZSTD, frame))
    tracemalloc.start()
    try:
        for codec, blob in cases:
            tracemalloc.reset_peak()
            with pytest.raises(CorruptRecordError) as exc:
                c.decompress(codec, blob, 64 * MiB)
            assert exc.value.reason.startswith(c.codec_name(codec) + ": ")
            assert tracemalloc.get_traced_memory()[1] < MiB
    finally:
        tracemalloc.stop()


# --------------------------------------------------------------------------------------------
# malformed input
# --------------------------------------------------------------------------------------------


def assert_corrupt(codec, blob, max_size=10 * MiB):
    with pytest.raises(CorruptRecordError) as exc:
        c.decompress(codec, blob, max_size)
    err = exc.value
    assert err.path is None and err.position is None
    assert err.reason.startswith(c.codec_name(codec) + ": "), err.reason
    assert err.__cause__ is None or isinstance(err.__cause__, CorruptRecordError)


def snappy_boundaries(blob: bytes) -> set[int]:
    cuts, pos = {16}, 16
    while pos < len(blob):
        pos += 4 + struct.unpack_from(">i", blob, pos)[0]
        cuts.add(pos)
    return cuts


@pytest.mark.parametrize("codec", COMPRESSED, ids=c.codec_name)
def test_every_truncation_is_detected(codec):
    data = payload(70000 if codec == c.SNAPPY else 3000, "records")
    blob = c.compress(codec, data)
    allowed = snappy_boundaries(blob) if codec == c.SNAPPY else set()
    if len(blob) < 2500:
        cuts = range(1, len(blob))
    else:  # both ends densely, the middle sparsely
        cuts = sorted({*range(1, 200), *range(1, len(blob), 37), *range(len(blob) - 200, len(blob))})
    for cut in cuts:
        if cut in allowed:
            # xerial framing has no end mark: a cut between blocks is a shorter valid stream
            # (the batch CRC catches it). It must decode to a prefix.
            assert data.startswith(c.decompress(codec, blob[:cut], len(data)))
            continue
        assert_corrupt(codec, blob[:cut])


@pytest.mark.parametrize("codec", COMPRESSED, ids=c.codec_name)
def test_trailing_garbage_is_rejected(codec):
    data = payload(5000, "records")
    blob = c.compress(codec, data)
    for tail in (b"\x00", b"\x00\x00\x00", b"garbage!", os.urandom(100)):
        if codec == c.SNAPPY and len(tail) >= 4:
            continue  # to xerial, 4+ more bytes are a block length; covered by fuzzing below
        assert_corrupt(codec, blob + tail)


MAGICS = {
    c.GZIP: b"\x1f\x8b\x08\x00",
    c.SNAPPY: XERIAL_HEADER,
    c.LZ4: bytes([0x04, 0x22, 0x4D, 0x18, 0x60, 0x40, 0x82]),
    c.ZSTD: b"\x28\xb5\x2f\xfd",
}


@pytest.mark.parametrize("codec", COMPRESSED, ids=c.codec_name)
@settings(max_examples=150, deadline=None)
@given(garbage=st.binary(min_size=1, max_size=300), with_magic=st.booleans())
def test_garbage_never_escapes_as_another_error(codec, garbage, with_magic):
    blob = (MAGICS[codec] + garbage) if with_magic else garbage
    try:
        out = c.decompress(codec, blob, MiB)
    except CorruptRecordError as err:
        assert err.reason.startswith(c.codec_name(codec) + ": ")
    else:
        assert type(out) is bytes and len(out) <= MiB  # e.g. b"\x00" is valid raw snappy


@pytest.mark.parametrize("codec", COMPRESSED, ids=c.codec_name)
@settings(max_examples=60, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4))
def test_bit_flips_give_bytes_or_corrupt(codec, flips):
    data = payload(40000, "records")
    blob = bytearray(c.compress(codec, data))
    for pos, mask in flips:
        blob[pos % len(blob)] ^= mask
    try:
        out = c.decompress(codec, bytes(blob), len(data) + 1000)
    except CorruptRecordError:
        return
    assert type(out) is bytes and len(out) <= len(data) + 1000


@pytest.mark.parametrize("codec", COMPRESSED, ids=c.codec_name)
def test_specific_malformed_inputs(codec):
    data = payload(5000, "records")
    blob = c.compress(codec, data)
    flipped = bytearray(blob)
    flipped[len(flipped) // 2] ^= 0xFF
    flipped[len(flipped) // 2 + 1] ^= 0x55
    must_fail = [b"\x00" * 64]
    if codec == c.GZIP:
        must_fail += [bytes(flipped), blob[:-8] + b"\0" * 8, b"\x1f\x8b\x09" + blob[3:], os.urandom(64)]
    if codec == c.SNAPPY:
        must_fail += [
            XERIAL_HEADER + b"\xff\xff\xff\xff",  # negative block length
            XERIAL_HEADER + b"\x00\x00\x00\x00",  # empty block
            XERIAL_HEADER + b"\x00\x00\x10\x00" + b"\x05",  # block longer than the stream
            XERIAL_HEADER + struct.pack(">i", 3) + b"\x05ab",  # block shorter than it declares
            XERIAL_HEADER + b"\x82SNA" + b"\x00" * 12,  # bad concatenated header
            b"\x80\x80\x80\x80\x80\x01",  # varint longer than 5 bytes
        ]
    if codec == c.LZ4:
        must_fail += [
            bytes([0x04, 0x22, 0x4D, 0x18, 0xA0, 0x40, 0x00, 0, 0, 0, 0]),  # version 2
            bytes([0x04, 0x22, 0x4D, 0x18, 0x62, 0x40, 0x00, 0, 0, 0, 0]),  # reserved bit
            bytes([0x04, 0x22, 0x4D, 0x18, 0x60, 0x30, 0x00, 0, 0, 0, 0]),  # block size id 3
            blob[:6] + bytes([blob[6] ^ 1]) + blob[7:],  # bad header checksum
            os.urandom(64),
        ]
    if codec == c.ZSTD:
        must_fail += [
            b"\x28\xb5\x2f\xfd\x00\x00\x07\x00\x00",  # reserved block type
            b"\x22\xb5\x2f\xfd" + blob[4:],  # legacy/unknown magic
            os.urandom(64),
        ]
    for sample in must_fail:
        assert_corrupt(codec, sample, MiB)
    # Without a checksum in the format (snappy, Kafka's lz4 and zstd) a flipped byte may decode to
    # wrong data; the batch CRC catches that. It must never raise anything else.
    try:
        out = c.decompress(codec, bytes(flipped), MiB)
    except CorruptRecordError as err:
        assert err.reason.startswith(c.codec_name(codec) + ": ")
    else:
        assert codec != c.GZIP and type(out) is bytes


def failing_inputs(codec):
    """(blob, max_size) pairs that fail on each error path, including after slicing the input."""
    data = payload(100000, "records")
    good = c.compress(codec, data)
    cases = [(good, 1000)]  # bomb
    if codec == c.GZIP:
        second = bytearray(c.compress(c.GZIP, data))
        second[len(second) // 2] ^= 0xFF
        cases.append((good + bytes(second), 10 * len(data)))  # bad second member
    if codec == c.SNAPPY:
        bad = bytearray(good)
        third = sorted(snappy_boundaries(good))[2]  # start of the third block
        assert bad[third + 4 : third + 7] == b"\x80\x80\x02"  # varint 32768
        bad[third + 4 : third + 7] = b"\xff\xff\x01"  # declares 32767: the block fails to decode
        cases.append((bytes(bad), len(data)))
        cases.append((good[16 + 4 : 16 + 4 + 20], len(data)))  # raw snappy cut short
    if codec == c.LZ4:
        cases.append((good[:6] + bytes([good[6] ^ 1]) + good[7:], len(data)))  # header checksum
    if codec == c.ZSTD:
        import zstandard

        block_header = ((10 << 3) | (2 << 1) | 1).to_bytes(3, "little")  # last, compressed, 10 bytes
        broken = b"\x28\xb5\x2f\xfd\x00\x00" + block_header + b"\xff" * 10
        cases.append((good + broken, 10 * len(data)))  # bad second frame
        no_size = zstandard.ZstdCompressor(write_content_size=False).compress(data)
        cases.append((no_size, 1000))  # streaming (bounded) path
        cases.append((no_size + no_size, len(data) + 1000))  # bomb in the second frame
    return cases


@pytest.mark.parametrize("codec", COMPRESSED, ids=c.codec_name)
def test_callers_buffer_is_free_after_errors(codec, tmp_path):
    """records.py releases its memoryview (and segments close their mmap) while the error that
    decompress() raised is still alive, e.g. as __context__ of a re-raised error."""
    for blob, max_size in failing_inputs(codec):
        # a memoryview slice, released by the caller
        buf = bytearray(b"HDR" + blob)
        section = memoryview(buf)[3:]
        with pytest.raises(CorruptRecordError) as caught:
            c.decompress(codec, section, max_size)
        section.release()
        buf.extend(b"x")  # BufferError if any export of buf were still alive
        # the bytearray itself
        buf = bytearray(blob)
        with pytest.raises(CorruptRecordError) as caught:
            c.decompress(codec, buf, max_size)
        buf.extend(b"x")
        # an mmap, closed by the caller
        path = tmp_path / "segment"
        path.write_bytes(blob)
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        with pytest.raises(CorruptRecordError) as caught:
            c.decompress(codec, mapped, max_size)
        mapped.close()  # BufferError if any export were still alive
        assert caught.value.reason.startswith(c.codec_name(codec) + ": ")


@pytest.mark.parametrize("codec", CODECS, ids=c.codec_name)
def test_callers_buffer_is_free_after_success(codec):
    data = payload(200000, "records")
    blob = c.compress(codec, data)
    for item in (bytearray(data), memoryview(bytearray(data))):
        out = c.compress(codec, item)
        base = item.obj if isinstance(item, memoryview) else item
        if isinstance(item, memoryview):
            item.release()
        base.extend(b"x")
        assert c.decompress(codec, out, len(data)) == data
    buf = bytearray(blob)
    view = memoryview(buf)
    assert c.decompress(codec, view, len(data)) == data
    view.release()
    buf.extend(b"x")


def test_errors_name_the_codec_and_problem():
    with pytest.raises(CorruptRecordError) as exc:
        c.decompress(c.GZIP, c.compress(c.GZIP, b"abc" * 100)[:-5], 1000)
    assert "gzip: truncated" in str(exc.value)
    assert exc.value.path is None and exc.value.position is None
