"""Primitives under the end-to-end paths: CRC32C, batch encode, batch decode, per codec.

Encode is ``BatchBuilder.build`` of one batch (what ``append_batch`` does before the copy into
the segment); decode is ``RecordDecoder.decode`` of one encoded batch into Record objects (what
``Log.read`` does per batch) and the thread-safe one-off ``decode_batches``. Figures are per
record, and MB/s of uncompressed key+value bytes.
"""

from __future__ import annotations

import os

import pytest

import _report
from logstore.records import compression
from logstore._native import lib
from logstore.records.batch import BatchBuilder, RecordDecoder, decode_batches

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
# Payload sizes for the uncompressed batch; the codecs are compared at the 200 bytes.
CODEC_PAYLOADS = [("none", 100), ("none", 200), ("none", 1000)] + [(c, 200) for c in CODECS[1:]]


def _available(codec: str) -> None:
    if compression.codec_from_name(codec, require_available=False) not in compression.available_codecs():
        pytest.skip(f"{codec} library not installed")


# ---------------------------------------------------------------------- crc32c
@pytest.mark.benchmark(group="primitive: crc32c")
@pytest.mark.parametrize("size", [4096, 1 << 20], ids=["4KiB", "1MiB"])
@pytest.mark.parametrize("impl", ["ls_crc32c", "ls_crc32c_sw"])
def test_crc32c(benchmark, impl, size):
    """One cffi call per buffer: at 4 KiB the ~0.1 us call overhead is part of the figure."""
    data = os.urandom(size)
    fn = getattr(lib, impl)
    benchmark(fn, 0, data, size)
    _report.report(benchmark, nbytes=size, unit="GB/s",
                   note=f"{benchmark.stats.stats.mean * 1e9:,.0f} ns per call")


# ---------------------------------------------------------------------- encode
@pytest.mark.benchmark(group="primitive: BatchBuilder.build (1000 records)")
@pytest.mark.parametrize(("codec", "payload"), CODEC_PAYLOADS)
def test_batch_encode(benchmark, pool, codec, payload):
    _available(codec)
    values, keys = pool(payload)
    values, keys = values[:1000], keys[:1000]
    builder = BatchBuilder()
    codec_id = compression.codec_from_name(codec)
    batch = benchmark(builder.build, values, keys, codec=codec_id)
    raw = sum(map(len, values)) + sum(map(len, keys))
    benchmark.extra_info["batch_bytes"] = len(batch)
    benchmark.extra_info["compression_ratio"] = raw / len(batch)
    _report.report(benchmark, records=1000, nbytes=raw, note=f"{len(batch):,} B batch, ratio {raw / len(batch):.2f}")


@pytest.mark.benchmark(group="primitive: BatchBuilder.build (batch size, 200 B)")
@pytest.mark.parametrize("batch", [1, 50])
def test_batch_encode_small(benchmark, pool, batch):
    values, keys = pool(200)
    values, keys = values[:batch], keys[:batch]
    builder = BatchBuilder()
    benchmark(builder.build, values, keys)
    _report.report(benchmark, records=batch, nbytes=batch * 216,
                   note=f"{benchmark.stats.stats.mean * 1e6:.2f} us per batch")


# ---------------------------------------------------------------------- decode
@pytest.mark.benchmark(group="primitive: RecordDecoder.decode (1000-record batch)")
@pytest.mark.parametrize(("codec", "payload"), CODEC_PAYLOADS)
def test_batch_decode(benchmark, pool, codec, payload):
    _available(codec)
    values, keys = pool(payload)
    batch = BatchBuilder().build(values[:1000], keys[:1000], codec=compression.codec_from_name(codec))
    decoder = RecordDecoder()
    records, _ = decoder.decode(batch, 0, len(batch))
    assert len(records) == 1000 and records[7].value == values[7]
    benchmark(decoder.decode, batch, 0, len(batch))
    _report.report(benchmark, records=1000, nbytes=1000 * (payload + 16))


@pytest.mark.benchmark(group="primitive: RecordDecoder.decode (1000-record batch)")
def test_decode_batches_oneoff(benchmark, pool):
    """decode_batches() allocates a fresh RecordDecoder per call (its thread-safe form)."""
    values, keys = pool(200)
    batch = BatchBuilder().build(values[:1000], keys[:1000])
    benchmark(decode_batches, batch)
    _report.report(benchmark, records=1000, nbytes=1000 * 216)


@pytest.mark.benchmark(group="primitive: RecordDecoder.decode (batch size, 200 B)")
@pytest.mark.parametrize("batch", [1, 50])
def test_batch_decode_small(benchmark, pool, batch):
    """Many small batches in one buffer (what single appends leave on disk), decoded in one call."""
    values, keys = pool(200)
    builder = BatchBuilder()
    buf = b"".join(builder.build(values[i : i + batch], keys[i : i + batch], base_offset=i)
                   for i in range(0, 1000, batch))
    decoder = RecordDecoder()
    benchmark(decoder.decode, buf, 0, len(buf))
    _report.report(benchmark, records=1000, nbytes=1000 * 216)


@pytest.mark.benchmark(group="primitive: BatchBuilder.build zstd levels (1000 records, 200 B)")
@pytest.mark.parametrize("level", [-1, 1, 3, 6])
def test_batch_encode_zstd_level(benchmark, pool, level):
    """Kafka's default zstd level is 3 (LogConfig compression_zstd_level=None); lower is faster."""
    _available("zstd")
    values, keys = pool(200)
    values, keys = values[:1000], keys[:1000]
    builder = BatchBuilder()
    batch = benchmark(builder.build, values, keys, codec=compression.ZSTD, level=level)
    raw = 216_000
    benchmark.extra_info["compression_ratio"] = raw / len(batch)
    _report.report(benchmark, records=1000, nbytes=raw, note=f"{len(batch):,} B batch, ratio {raw / len(batch):.2f}")


# ---------------------------------------------------------------------- the disk
@pytest.mark.benchmark(group="primitive: pwrite + fdatasync (the disk's floor for durable appends)")
@pytest.mark.parametrize("size", [83_000, 226_000], ids=["83KB-zstd-batch", "226KB-plain-batch"])
def test_write_fdatasync(benchmark, scratch, size):
    """What one durable batch costs the disk alone: append ``size`` bytes with os.pwrite and
    fdatasync, 20 times per round (sizes of a 1000-record batch, zstd and uncompressed).
    records/s is per 1000-record batch: the ceiling for append_batch + fsync per batch."""
    data = os.urandom(size)
    fd = os.open(os.path.join(scratch, "fsync.bin"), os.O_RDWR | os.O_CREAT, 0o644)
    position = [0]

    def run():
        for _ in range(20):
            os.pwrite(fd, data, position[0])
            os.fdatasync(fd)
            position[0] += size

    try:
        benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    finally:
        os.close(fd)
    mean = benchmark.stats.stats.mean
    _report.report(benchmark, records=20_000, nbytes=20 * size,
                   note=f"{mean / 20 * 1e3:.2f} ms per write+fdatasync")
