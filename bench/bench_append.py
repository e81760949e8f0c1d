"""Appends: append_batch and single-record append, without fsync and with an fsync per batch.

Each round appends a fixed number of records to a *fresh* log (created in the untimed setup,
abandoned and deleted in the untimed teardown, so no round pays for another round's fsync at
close). A round therefore includes what a steady writer pays too: new page-cache pages for
every byte (through pwrite for batches, through first-touch faults of the mapped segment for
single records) and the map's growth steps (8 MiB, doubling), but never a segment roll.

Workload: compact JSON values of exactly ``payload`` bytes, 16-byte keys, default timestamps.
"""

from __future__ import annotations

import os

import pytest

import _report
from logstore import Log


def _round_of_batches(pool, payload: int, batch: int, records: int):
    values, keys = pool(payload)
    assert records % batch == 0
    n_batches = records // batch
    per_pool = len(values) // batch
    batches = [(values[(i % per_pool) * batch : (i % per_pool + 1) * batch],
                keys[(i % per_pool) * batch : (i % per_pool + 1) * batch]) for i in range(n_batches)]
    return batches


class _FreshLog:
    """setup/teardown pair for pedantic: every round appends to a new, empty log."""

    def __init__(self, root: str, **config):
        self.root = root
        self.config = config
        self.n = 0
        self.log: Log | None = None

    def setup(self):
        self.n += 1
        self.log = Log.open(os.path.join(self.root, f"bench-{self.n}"), **self.config)
        return (self.log,), {}

    def teardown(self, log: Log) -> None:
        log._abandon()  # no close-time fsync of this round's data
        path = log.path
        for name in os.listdir(path):
            os.unlink(os.path.join(path, name))
        os.rmdir(path)


# ---------------------------------------------------------------------- append_batch, no fsync
_BATCH_RECORDS = {1: 10_000, 50: 50_000, 1000: 100_000}


@pytest.mark.benchmark(group="append_batch, no fsync")
@pytest.mark.parametrize("payload", [100, 200, 1000])
@pytest.mark.parametrize("batch", [1, 50, 1000])
def test_append_batch(benchmark, pool, scratch, batch, payload):
    records = _BATCH_RECORDS[batch]
    batches = _round_of_batches(pool, payload, batch, records)
    fresh = _FreshLog(scratch)

    def run(log):
        append_batch = log.append_batch
        for values, keys in batches:
            append_batch(values, keys)

    benchmark.pedantic(run, setup=fresh.setup, teardown=fresh.teardown, rounds=8, warmup_rounds=1)
    target = 3_000_000 if (batch, payload) == (1000, 200) else None
    _report.report(benchmark, records=records, nbytes=records * (payload + 16), target=target)


@pytest.mark.benchmark(group="append_batch, no fsync")
@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_append_batch_compressed(benchmark, pool, scratch, codec):
    """Separates codec cost from fsync cost: compare with the fsync group below."""
    records = 100_000
    batches = _round_of_batches(pool, 200, 1000, records)
    fresh = _FreshLog(scratch)

    def run(log):
        for values, keys in batches:
            log.append_batch(values, keys, compression=codec)

    benchmark.pedantic(run, setup=fresh.setup, teardown=fresh.teardown, rounds=8, warmup_rounds=1)
    _report.report(benchmark, records=records, nbytes=records * 216)


# ---------------------------------------------------------------------- append, no fsync
@pytest.mark.benchmark(group="append one record per call, no fsync")
@pytest.mark.parametrize("payload", [100, 200, 1000])
def test_append_single(benchmark, pool, scratch, payload):
    values, keys = pool(payload)
    records = 100_000
    pairs = [(values[i % len(values)], keys[i % len(keys)]) for i in range(records)]
    fresh = _FreshLog(scratch)

    def run(log):
        append = log.append
        for value, key in pairs:
            append(value, key)

    benchmark.pedantic(run, setup=fresh.setup, teardown=fresh.teardown, rounds=8, warmup_rounds=1)
    target = 1_000_000 if payload == 200 else None
    _report.report(benchmark, records=records, nbytes=records * (payload + 16), target=target)


# ---------------------------------------------------------------------- append_batch + fsync
@pytest.mark.benchmark(group="append_batch + fsync per batch (flush_messages=batch)")
@pytest.mark.parametrize("payload", [200])
@pytest.mark.parametrize("batch", [50, 1000])
@pytest.mark.parametrize("codec", ["none", "zstd", "lz4"])
def test_append_batch_fsync(benchmark, pool, scratch, codec, batch, payload):
    records = 100_000 if batch == 1000 else 20_000
    batches = _round_of_batches(pool, payload, batch, records)
    fresh = _FreshLog(scratch, flush_messages=batch)
    fsyncs = records // batch

    def run(log):
        for values, keys in batches:
            log.append_batch(values, keys, compression=codec)
        assert log.recovery_point == log.log_end_offset  # every batch was fsynced

    benchmark.pedantic(run, setup=fresh.setup, teardown=fresh.teardown, rounds=5, warmup_rounds=1)
    target = 1_000_000 if (codec, batch, payload) == ("zstd", 1000, 200) else None
    benchmark.extra_info["fsyncs_per_s"] = fsyncs / benchmark.stats.stats.mean
    _report.report(benchmark, records=records, nbytes=records * (payload + 16), target=target,
                   note=f"{fsyncs / benchmark.stats.stats.mean:,.0f} fsync/s")


@pytest.mark.benchmark(group="append_batch + fsync per batch (flush_messages=batch)")
@pytest.mark.parametrize("payload", [100, 1000])
def test_append_batch_fsync_zstd_payloads(benchmark, pool, scratch, payload):
    records = 100_000
    batches = _round_of_batches(pool, payload, 1000, records)
    fresh = _FreshLog(scratch, flush_messages=1000)

    def run(log):
        for values, keys in batches:
            log.append_batch(values, keys, compression="zstd")

    benchmark.pedantic(run, setup=fresh.setup, teardown=fresh.teardown, rounds=5, warmup_rounds=1)
    _report.report(benchmark, records=records, nbytes=records * (payload + 16))


@pytest.mark.benchmark(group="append one record per call + fsync each (flush_messages=1)")
def test_append_single_fsync(benchmark, pool, scratch):
    values, keys = pool(200)
    records = 2_000
    fresh = _FreshLog(scratch, flush_messages=1)

    def run(log):
        for i in range(records):
            log.append(values[i], keys[i])

    benchmark.pedantic(run, setup=fresh.setup, teardown=fresh.teardown, rounds=3, warmup_rounds=1)
    _report.report(benchmark, records=records, nbytes=records * 216)


# ---------------------------------------------------------------------- storage overhead
def _varint_size(v: int) -> int:
    z = (v << 1) ^ (v >> 63)
    n = 1
    while z >= 0x80:
        z >>= 7
        n += 1
    return n


def _format_minimum(batch_values: list[list[bytes]], key_size: int) -> int:
    """Bytes of framing Kafka's RecordBatch v2 needs for these batches (no headers, one
    timestamp per batch): 61 bytes per batch plus each record's varint fields."""
    total = 0
    for values in batch_values:
        total += 61
        for delta, value in enumerate(values):
            body = (1 + _varint_size(0) + _varint_size(delta) + _varint_size(key_size) + key_size
                    + _varint_size(len(value)) + len(value) + _varint_size(0))
            total += _varint_size(body) + body - key_size - len(value)
    return total


@pytest.mark.benchmark(group="storage overhead, 50 records per batch, uncompressed")
@pytest.mark.parametrize("payload", [100, 200, 1000])
def test_storage_overhead(benchmark, pool, scratch, payload):
    """A measurement, not a speed: bytes of the .log beyond the raw key+value bytes, per record.

    The timed part is just the write of 20,000 records (400 batches); the figure that matters is
    ``overhead_bytes_per_record`` in extra_info. Asserted: the .log holds exactly Kafka's
    framing and nothing else (so any target below that is a property of the format).
    """
    records = 20_000
    batches = _round_of_batches(pool, payload, 50, records)
    raw = sum(len(v) + len(k) for values, keys in batches for v, k in zip(values, keys))
    logs: list[Log] = []

    def setup():
        log = Log.open(os.path.join(scratch, f"overhead-{len(logs)}"))
        logs.append(log)
        return (log,), {}

    def run(log):
        for values, keys in batches:
            log.append_batch(values, keys)

    benchmark.pedantic(run, setup=setup, teardown=lambda log: log.close(), rounds=3)
    path = logs[-1].path  # closed by the teardown: the active segment is trimmed to its data
    log_files = [f for f in os.listdir(path) if f.endswith(".log")]
    on_disk = sum(os.path.getsize(os.path.join(path, f)) for f in log_files)
    allocated = sum(os.stat(os.path.join(path, f)).st_blocks * 512 for f in log_files)
    per_record = (on_disk - raw) / records
    minimum = _format_minimum([values for values, _ in batches], 16)
    benchmark.extra_info.update(log_bytes=on_disk, log_bytes_allocated=allocated, raw_key_value_bytes=raw,
                                format_minimum_per_record=minimum / records)
    _report.report_value(benchmark, "overhead_bytes_per_record", per_record, "bytes/record",
                         at_most=10 if payload == 200 else None,
                         note=f"Kafka v2 framing minimum {minimum / records:.2f}")
    assert on_disk - raw == minimum, (on_disk - raw, minimum)


@pytest.mark.benchmark(group="append_batch + fsync per batch (flush_messages=batch)")
def test_append_batch_fsync_zstd_level_1(benchmark, pool, scratch):
    """The zstd target with Kafka's compression.zstd.level=1 instead of the default 3."""
    records = 100_000
    batches = _round_of_batches(pool, 200, 1000, records)
    fresh = _FreshLog(scratch, flush_messages=1000, compression_zstd_level=1)

    def run(log):
        for values, keys in batches:
            log.append_batch(values, keys, compression="zstd")
        assert log.recovery_point == log.log_end_offset

    benchmark.pedantic(run, setup=fresh.setup, teardown=fresh.teardown, rounds=5, warmup_rounds=1)
    _report.report(benchmark, records=records, nbytes=records * 216, target=1_000_000,
                   note="compression_zstd_level=1")
