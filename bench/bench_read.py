"""Sequential reads of a pre-written log into Record objects.

Each source log holds ~1M records (200-byte JSON values, 16-byte keys) written once per module
by one of: append_batch of 1000, append_batch of 50, single appends (one batch per record), and
append_batch of 1000 with zstd. A round reads the whole log from offset 0, either with
``Log.read(offset, max_bytes=1 MiB)`` in a loop (what a fetcher does) or with ``Log.iter()``
drained by ``collections.deque(maxlen=0)`` (the cheapest possible consumer). The log stays open
as written, so the last segment is the active one, as for a consumer tailing a live log; all of
it is in the page cache.
"""

from __future__ import annotations

import collections
import os

import pytest

import _report
import _workload
from logstore import Log

RECORDS = 1_000_000
PAYLOAD = 200
MAX_BYTES = 1 << 20


def _write(path: str, pool, how: str) -> Log:
    values, keys = pool(PAYLOAD)
    log = Log.open(path)
    if how == "single":
        append = log.append
        n = len(values)
        for i in range(RECORDS):
            append(values[i % n], keys[i % n])
    else:
        batch = {"batch1000": 1000, "batch50": 50, "batch1000-zstd": 1000}[how]
        codec = "zstd" if how.endswith("zstd") else None
        slices = [(values[i : i + batch], keys[i : i + batch]) for i in range(0, len(values), batch)]
        for i in range(RECORDS // batch):
            v, k = slices[i % len(slices)]
            log.append_batch(v, k, compression=codec)
    assert log.log_end_offset == RECORDS
    return log


@pytest.fixture(scope="module")
def source_logs(pool):
    with _workload.scratch_dir("logstore-bench-read-") as root:
        logs: dict[str, Log] = {}

        def get(how: str) -> Log:
            if how not in logs:
                logs[how] = _write(os.path.join(root, f"{how}-0"), pool, how)
            return logs[how]

        yield get
        for log in logs.values():
            log._abandon()  # nothing to keep; skip the close-time fsync


def _read_all(log: Log) -> int:
    read = log.read
    offset, end, n = 0, log.log_end_offset, 0
    while offset < end:
        records = read(offset, max_bytes=MAX_BYTES)
        n += len(records)
        offset = records[-1].offset + 1
    return n


def _iter_all(log: Log) -> int:
    collections.deque(log.iter(), maxlen=0)  # the default 256 KiB chunks
    return RECORDS


@pytest.mark.benchmark(group="sequential read to Record objects (1M records, 200 B values)")
@pytest.mark.parametrize("api", ["read", "iter"])
@pytest.mark.parametrize("written_by", ["batch1000", "batch50", "single", "batch1000-zstd"])
def test_sequential_read(benchmark, source_logs, written_by, api):
    log = source_logs(written_by)
    fn = _read_all if api == "read" else _iter_all
    assert fn(log) == RECORDS  # also warms the page cache and the decoder's buffers
    n = benchmark.pedantic(fn, args=(log,), rounds=4, warmup_rounds=0)
    assert n == RECORDS
    benchmark.extra_info["log_bytes"] = log.size_in_bytes
    target = 2_000_000 if written_by in ("batch1000", "single") else None
    _report.report(benchmark, records=RECORDS, nbytes=log.size_in_bytes, target=target)
