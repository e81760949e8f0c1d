"""Compaction (issues 3 and 31): one cleaning pass over a sealed log, the physical limit beside
it, and the pass's key -> offset map.

Compaction pass: a fresh log (untimed setup) of ``LOGSTORE_BENCH_COMPACTION_MB`` MB (default
256; the issue's target is stated for 1 GB) of 200-byte JSON values in batches of 1000, keys
``b"key-%08d" % (i % (N // 10))`` (12 bytes), so that 10% of the records carry distinct keys,
every key recurs once per tenth of the log and each key's latest record lies in the last tenth:
the whole log is dirty (no clean section: a first pass), the first nine tenths of its batches are
dropped whole and the last tenth survives whole. segment_bytes=64 MiB, rolled so that every
segment is sealed, and fsynced before the timed part so that write-back of the input does not
overlap it. Uncompressed (``none``, the issue's >= 300 MB/s) and with the log's codec set to lz4
and zstd (the producer's batches compressed whole; the same records). One round times one
``log.compact()``: building the offset map over the dirty section, the cleaned segment written
and fsynced, the swap (renames, directory fsyncs) and the old segments unlinked. MB/s is
``report.bytes_read`` (bytes of log read: the segment files' sizes, compressed bytes for a
compressed log) per round time. The input is in the page cache: this measures the CPU side of a
pass plus the write and fsync of the cleaned segments, not reading from disk.

Physical limit (``test_compaction_physical_limit``): the same log's segment files read
sequentially in 8 MiB preads and the same number of bytes written to a new file and fsynced,
through the page cache, in MB/s of bytes read (what a pass that only copied its input would
reach on this VM).

Offset map: bytes per distinct key of an ``OffsetMap`` filled to ``max_size``, against a Python
dict ``{xxh3_128 digest: offset}`` holding the same keys (measured with tracemalloc, counting
the digests, the offset ints and the table), and the speed of put/get for 1M keys in both.
"""

from __future__ import annotations

import gc
import os
import shutil
import tracemalloc

import pytest

import _report
import _workload
from logstore import Log
from logstore.cleaner import OffsetMap, key_hash

MB = int(os.environ.get("LOGSTORE_BENCH_COMPACTION_MB", "256"))
BATCH = 1000
VALUE_SIZE = 200
KEY_FORMAT = b"key-%08d"  # 12 bytes
# A record of a 200-byte value and 12-byte key takes ~221 bytes in a batch of 1000.
_RECORD_BYTES = 221


def _records_for(mb: int) -> int:
    n = mb * 1_000_000 // _RECORD_BYTES
    return max(10 * BATCH, n // (10 * BATCH) * (10 * BATCH))  # whole batches, 10 | N


# ---------------------------------------------------------------------- one compaction pass
class _CompactableLog:
    """setup/teardown pair for pedantic: every round compacts a freshly written log."""

    def __init__(self, root: str, records: int, codec: str = "none") -> None:
        self.root = root
        self.codec = codec
        self.records = records
        self.distinct = records // 10
        self.values = _workload.make_values(4 * BATCH, VALUE_SIZE)
        self.n = 0

    def setup(self):
        self.n += 1
        log = Log.open(os.path.join(self.root, f"compact-{self.n}"), cleanup_policy="compact",
                       segment_bytes=64 << 20, compression_type=self.codec)
        values, distinct = self.values, self.distinct
        for start in range(0, self.records, BATCH):
            first = start % len(values)
            log.append_batch(values[first : first + BATCH],
                             [KEY_FORMAT % (i % distinct) for i in range(start, start + BATCH)])
        log.roll()
        log.flush()
        gc.collect()
        return (log,), {}

    def teardown(self, log: Log) -> None:
        log._abandon()  # no close-time fsync
        shutil.rmtree(log.path, ignore_errors=True)


@pytest.mark.benchmark(group="compaction")
@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
def test_compaction_pass(benchmark, scratch, codec):
    records = _records_for(MB)
    fresh = _CompactableLog(scratch, records, codec)
    distinct = fresh.distinct
    reports = []
    checked = []

    def run(log):
        reports.append(log.compact())

    def teardown(log):
        if not checked:  # the compacted log holds exactly the latest record of every key
            survivors = list(log.iter())
            assert len(survivors) == distinct
            assert {r.key for r in survivors} == {KEY_FORMAT % k for k in range(distinct)}
            assert all(r.offset >= records - distinct for r in survivors)
            checked.append(True)
        fresh.teardown(log)

    benchmark.pedantic(run, setup=fresh.setup, teardown=teardown, rounds=2)
    report = reports[-1]
    assert checked
    assert report.records_kept == distinct and report.records_dropped == records - distinct
    assert report.cleaned_up_to == records and report.first_dirty_offset == 0
    assert all(r.bytes_read == report.bytes_read for r in reports)
    benchmark.extra_info.update(
        input_mb=report.bytes_read / 1e6, output_mb=report.bytes_written / 1e6, records=records,
        distinct_keys=distinct, segments_cleaned=report.segments_cleaned,
        pass_duration_s=[r.duration_s for r in reports],
    )
    mbps = _report.report(benchmark, records=records, nbytes=report.bytes_read,
                          target=300 if codec == "none" else None, unit="MB/s",
                          note=f"{codec}: {report.bytes_read / 1e6:,.0f} MB in, {report.bytes_written / 1e6:,.1f} MB out")
    print(f"\ncompaction ({codec}): {report.bytes_read / 1e6:,.0f} MB read, {report.bytes_written / 1e6:,.1f} MB written, "
          f"{mbps:,.1f} MB/s (mean of {len(reports)} passes)")


@pytest.mark.benchmark(group="compaction")
def test_compaction_physical_limit(benchmark, scratch):
    """The uncompressed pass's input read sequentially and as many bytes written and fsynced."""
    fresh = _CompactableLog(scratch, _records_for(MB))
    (log,), _ = fresh.setup()
    sizes = {os.path.join(log.path, "%020d.log" % info.base_offset): info.size for info in log.segments if info.size}
    files = list(sizes)
    target = os.path.join(scratch, "physical-limit")
    chunk = 8 << 20

    def run():
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            for path in files:
                fd = os.open(path, os.O_RDONLY)
                try:
                    for position in range(0, sizes[path], chunk):
                        os.write(out, os.pread(fd, chunk, position))
                finally:
                    os.close(fd)
            os.fsync(out)
        finally:
            os.close(out)

    try:
        benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    finally:
        fresh.teardown(log)
        os.unlink(target)
    nbytes = sum(sizes.values())
    mbps = _report.report(benchmark, nbytes=nbytes, unit="MB/s", note=f"{nbytes / 1e6:,.0f} MB read and written")
    print(f"\nphysical limit: {nbytes / 1e6:,.0f} MB read + written + fsynced, {mbps:,.1f} MB/s")


# ---------------------------------------------------------------------- the offset map
N_KEYS = 1_000_000
_SPEED: dict[str, float] = {}  # op -> OffsetMap mean round time, for the dict rows' ratio


@pytest.fixture(scope="module")
def keys():
    return [KEY_FORMAT % i for i in range(N_KEYS)]


def _map_for(n: int) -> OffsetMap:
    """The smallest map (in whole slots) whose max_size is at least n."""
    slots = int(n / 0.9) + 1
    while True:
        m = OffsetMap(slots * 20)
        if m.max_size >= n:
            return m
        slots += 1


@pytest.mark.benchmark(group="compaction")
def test_offset_map_bytes_per_key(benchmark, keys):
    """OffsetMap filled to max_size: memory_bytes / len (the timed part is the fill)."""
    offset_map = _map_for(N_KEYS)
    fill = keys[: offset_map.max_size]
    offsets = list(range(len(fill)))

    def run():
        offset_map.clear()
        return offset_map.put(fill, offsets)

    recorded = benchmark.pedantic(run, rounds=3)
    assert recorded == len(offset_map) == offset_map.max_size
    assert offset_map.put([b"one-more-key"], [N_KEYS]) == 0  # full: put() stops
    per_key = offset_map.memory_bytes / len(offset_map)
    benchmark.extra_info.update(memory_bytes=offset_map.memory_bytes, keys=len(offset_map),
                                capacity=offset_map.capacity)
    _report.report_value(benchmark, "bytes_per_key", per_key, "bytes/key", at_most=24,
                         note="20-byte slots (128-bit hash + 32-bit relative offset) at load factor 0.9")
    print(f"\nOffsetMap: {per_key:.2f} bytes/key ({len(offset_map):,} keys in {offset_map.memory_bytes:,} bytes)")


@pytest.mark.benchmark(group="compaction")
def test_dict_bytes_per_key(benchmark, keys):
    """Baseline: {xxh3_128 digest: offset}, everything it holds counted by tracemalloc."""
    fill = keys[: _map_for(N_KEYS).max_size]

    def build():
        return {key_hash(k): o for o, k in enumerate(fill, start=1 << 20)}  # offsets > small-int cache

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    d = build()
    per_key = (tracemalloc.get_traced_memory()[0] - before) / len(d)
    tracemalloc.stop()
    assert len(d) == len(fill)
    del d
    benchmark.pedantic(build, rounds=1)  # the table row; the figure is the tracemalloc one
    _report.report_value(benchmark, "bytes_per_key", per_key, "bytes/key",
                         note="digest bytes + int + dict slot, tracemalloc")
    print(f"\ndict baseline: {per_key:.2f} bytes/key")


@pytest.mark.benchmark(group="compaction")
@pytest.mark.parametrize("impl", ["OffsetMap", "dict"])
@pytest.mark.parametrize("op", ["put", "get"])
def test_offset_map_speed(benchmark, keys, op, impl):
    """put / get of 1M distinct keys (hashing included in both); the dict row notes the ratio."""
    offsets = list(range(1 << 20, (1 << 20) + N_KEYS))
    expected = offsets
    if impl == "OffsetMap":
        store = _map_for(N_KEYS)
        if op == "put":
            def run():
                store.clear()
                return store.put(keys, offsets)
        else:
            store.put(keys, offsets)

            def run():
                return store.get(keys)
    else:
        if op == "put":
            def run():
                return dict(zip(map(key_hash, keys), offsets))
        else:
            store = dict(zip(map(key_hash, keys), offsets))

            def run():
                get = store.get
                return [get(h, -1) for h in map(key_hash, keys)]

    result = benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    if op == "get":
        assert result == expected
    elif impl == "OffsetMap":
        assert result == len(store) == N_KEYS
    else:
        assert len(result) == N_KEYS
    mean = benchmark.stats.stats.mean
    note = ""
    if impl == "OffsetMap":
        _SPEED[op] = mean
    elif op in _SPEED:
        ratio = mean / _SPEED[op]
        benchmark.extra_info["offset_map_speedup"] = ratio
        note = f"OffsetMap is {ratio:.2f}x the dict's speed"
        print(f"\n{op}: OffsetMap {_SPEED[op] * 1e3:.0f} ms, dict {mean * 1e3:.0f} ms per 1M keys -> {ratio:.2f}x")
    _report.report(benchmark, records=N_KEYS, note=note)
