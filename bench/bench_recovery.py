"""Recovery: opening a log after a crash rescans every segment from the recovery point.

The module writes ``LOGSTORE_BENCH_RECOVERY_MB`` (default 1024) MB of batches of 1000 records
(200-byte JSON values, 16-byte keys) with ``segment_bytes`` = 128 MiB, then drops the log
without a clean shutdown (``Log._abandon``: maps and descriptors go, no
``.kafka_cleanshutdown`` marker). Before every round the partition's entry in
``recovery-point-offset-checkpoint`` is removed (the whole file: it holds only this partition),
so ``Log.open`` finds the recovery point at 0 and must validate every batch (CRC32C and record
structure) and rebuild both indexes of every segment. The segments are in the page cache: this
measures the CPU side of recovery, not the disk.

The first recovery after the crash also trims the active segment's zero-filled mapped tail and
fsyncs that; it runs untimed before the rounds, so the rounds see the steady state (still with
the fsync of every segment and its rebuilt indexes that ``Log.open`` does after a recovery).

Next to it, the primitive: ``ls_segment_scan`` over one sealed 128 MiB segment, with and without
writing index entries, which is the floor for the end-to-end figure.
"""

from __future__ import annotations

import os

import pytest

import _report
import _workload
from logstore import Log
from logstore._native import ffi, lib
from logstore.checkpoint import RECOVERY_POINT_CHECKPOINT
from logstore.log.log import CLEAN_SHUTDOWN_FILE

SEGMENT_BYTES = 128 << 20
TOTAL_BYTES = int(os.environ.get("LOGSTORE_BENCH_RECOVERY_MB", "1024")) << 20


def _log_bytes(path: str) -> tuple[int, int]:
    files = [f for f in os.listdir(path) if f.endswith(".log")]
    return sum(os.path.getsize(os.path.join(path, f)) for f in files), len(files)


@pytest.fixture(scope="module")
def crashed_log(pool):
    values, keys = pool(200)
    slices = [(values[i : i + 1000], keys[i : i + 1000]) for i in range(0, len(values), 1000)]
    with _workload.scratch_dir("logstore-bench-recovery-") as root:
        path = os.path.join(root, "recovery-0")
        log = Log.open(path, segment_bytes=SEGMENT_BYTES)
        i = 0
        while log.size_in_bytes < TOTAL_BYTES:
            v, k = slices[i % len(slices)]
            log.append_batch(v, k)
            i += 1
        end = log.log_end_offset
        log._abandon()
        yield root, path, end


@pytest.mark.benchmark(group="recovery scan (page-cached segments)")
def test_recovery_open(benchmark, crashed_log):
    root, path, end = crashed_log
    holder: list[Log] = []

    def crash_again():
        while holder:
            holder.pop()._abandon()
        for name in (os.path.join(root, RECOVERY_POINT_CHECKPOINT), os.path.join(path, CLEAN_SHUTDOWN_FILE)):
            if os.path.exists(name):
                os.unlink(name)

    def open_log():
        log = Log.open(path, segment_bytes=SEGMENT_BYTES)
        holder.append(log)
        return log

    crash_again()
    first = open_log()  # untimed: trims the zero tail of the crashed active segment
    assert first.log_end_offset == end
    nbytes, segments = _log_bytes(path)
    # Size rolls must fill segments: a one-batch segment after every roll (a bug seen at 84e1df8,
    # where a size roll left the time-roll deadline unset) doubles the segments scanned here.
    assert segments <= -(-nbytes // SEGMENT_BYTES) + 1, f"{segments} segments for {nbytes} bytes"
    log = benchmark.pedantic(open_log, setup=crash_again, rounds=3)
    report = log.recovery_report
    assert not report.clean_shutdown and report.segments_recovered == segments, report
    assert report.bytes_truncated == 0 and log.log_end_offset == end
    crash_again()
    benchmark.extra_info.update(segments=segments, log_bytes=nbytes, records=end)
    _report.report(benchmark, records=end, nbytes=nbytes, unit="GB/s", target=1.0,
                   note=f"{segments} segments, {nbytes / 2**20:,.0f} MiB")


@pytest.mark.benchmark(group="recovery scan (page-cached segments)")
def test_open_after_clean_shutdown(benchmark, crashed_log):
    """For contrast: a clean open checks the indexes and walks only the last segment's tail."""
    root, path, end = crashed_log
    log = Log.open(path, segment_bytes=SEGMENT_BYTES)
    log.close()
    nbytes, segments = _log_bytes(path)

    def open_close():
        Log.open(path, segment_bytes=SEGMENT_BYTES).close()

    benchmark.pedantic(open_close, rounds=5, warmup_rounds=1)
    _report.report_value(benchmark, "open_close_ms", benchmark.stats.stats.mean * 1e3, "ms",
                         note=f"{segments} segments, {nbytes / 2**20:,.0f} MiB: nothing scanned but the tail")


@pytest.mark.benchmark(group="recovery scan (page-cached segments)")
@pytest.mark.parametrize("indexes", ["no-index", "with-index"])
def test_segment_scan_primitive(benchmark, crashed_log, indexes):
    """ls_segment_scan over the first (sealed, trimmed) 128 MiB segment."""
    root, path, end = crashed_log
    name = sorted(f for f in os.listdir(path) if f.endswith(".log"))[0]
    with open(os.path.join(path, name), "rb") as f:
        data = f.read()
    res = ffi.new("ls_scan_result *")
    cap = 10 << 20
    idx = ffi.new("char[]", cap) if indexes == "with-index" else ffi.NULL
    tidx = ffi.new("char[]", cap) if indexes == "with-index" else ffi.NULL
    icap, tcap = (cap // 8, cap // 12) if indexes == "with-index" else (0, 0)

    def scan():
        lib.ls_segment_scan(data, len(data), 0, 4096, 0, idx, icap, tidx, tcap, res)
        return res.records

    records = benchmark.pedantic(scan, rounds=5, warmup_rounds=1)
    assert res.status == lib.LS_OK and res.valid_bytes == len(data)
    _report.report(benchmark, records=records, nbytes=len(data), unit="GB/s")
