"""logstore quick start: write, read, roll segments, crash, reopen.

Run with ``make demo``. Everything happens in a temporary directory that is removed at the end.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time

import logstore


def crashing_writer(path: str, ready: "multiprocessing.synchronize.Event") -> None:
    """Append records in a child process that is then killed with SIGKILL mid-stream."""
    log = logstore.Log.open(path, segment_bytes=64 * 1024)
    for i in range(1_000_000):
        log.append(json.dumps({"event": i}).encode(), key=b"after-crash")
        if i == 2000:
            ready.set()


def main() -> None:
    root = tempfile.mkdtemp(prefix="logstore-demo-")
    path = os.path.join(root, "events-0")
    print(f"logstore {logstore.__version__}: demo log at {path}")

    # 1. Write: single appends and one batch, small segments so that they roll.
    with logstore.Log.open(path, segment_bytes=64 * 1024, index_interval_bytes=1024) as log:
        first = log.append(b'{"hello": "world"}', key=b"greeting", headers=[("source", b"demo")])
        for i in range(1, 1000):
            log.append(json.dumps({"n": i, "payload": "x" * 100}).encode(), key=f"key-{i % 10}".encode())
        base = log.append_batch([json.dumps({"batch": i}).encode() for i in range(5000)],
                                keys=[f"b{i}".encode() for i in range(5000)], compression="zstd")
        print(f"wrote offsets {first}..{log.log_end_offset - 1}; the zstd batch starts at {base}")
        print(f"segments: {len(log.segments)} (rolled at 64 KiB each)")
        for info in log.segments[:3]:
            print(f"  base={info.base_offset:<6} size={info.size:<6} records={info.record_count}")

        # 2. Read: by offset, and by timestamp.
        records = log.read(0, max_records=3)
        for r in records:
            print(f"  read offset={r.offset} key={r.key!r} value={r.value[:40]!r} headers={r.headers}")
        total = sum(1 for _ in log.iter())
        print(f"iterated {total} records from offset {log.log_start_offset}")
        ts = records[0].timestamp
        print(f"first offset with timestamp >= {ts}: {log.offset_for_timestamp(ts)}")
        log.flush()

    # 3. Crash: a child process appends and is killed with SIGKILL; nothing is flushed.
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=crashing_writer, args=(path, ready))
    child.start()
    ready.wait(60)
    time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    print(f"writer process killed with SIGKILL (exit code {child.exitcode})")

    # 4. Reopen: recovery scans from the recovery point and truncates any torn tail.
    with logstore.Log.open(path, segment_bytes=64 * 1024) as log:
        report = log.recovery_report
        print(f"reopened: clean_shutdown={report.clean_shutdown} segments_recovered={report.segments_recovered} "
              f"bytes_truncated={report.bytes_truncated}")
        last = log.read(log.log_end_offset - 1)[0]
        print(f"log end offset {log.log_end_offset}; last record key={last.key!r} value={last.value!r}")
        survivors = sum(1 for r in log.iter(start=6000) if r.key == b"after-crash")
        print(f"{survivors} records appended by the killed process survived (they were in the page cache)")
    print("done")


if __name__ == "__main__":
    sys.exit(main())
