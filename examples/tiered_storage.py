"""Tiered storage (Kafka's KIP-405): a topic keeps a short tail on local disk and the rest in an
object store, and every reader reads it all back.

Run with ``make demo``. The store is opened with ``remote_storage=`` an object store URL: here a
local directory (``file:///...``: no server needed); ``s3://bucket/prefix`` with
``remote_storage_options={"endpoint": ...}`` and credentials from the environment works the same
way (the README's tiered-storage section). A topic with ``remote_storage_enable`` has its sealed
segments copied by the store's remote log manager (a background thread; ``run_maintenance()``
runs one round now) and, once copied, dropped from the local disk by ``local_retention_*``; its
total ``retention_*`` then applies to the remote segments.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import logstore


def files(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names)


def main() -> None:
    work = tempfile.mkdtemp(prefix="logstore-tiered-")
    data, remote = os.path.join(work, "data"), os.path.join(work, "remote")
    try:
        with logstore.LogStore(data, remote_storage=f"file://{remote}") as store:
            # small segments so that a few thousand records make several; keep no copied
            # segment locally (local.retention.bytes=0), keep everything in the remote tier
            store.create_topic("events", remote_storage_enable=True, segment_bytes=64 << 10,
                               local_retention_bytes=0, retention_ms=-1)
            log = store.partition("events", 0)
            log.append_batch([f"event {i}".encode() * 10 for i in range(20_000)])
            print(f"appended {log.log_end_offset} records in {len(log.segments)} local segments")
            done = store.run_maintenance()  # one round of the remote log manager, now
            print(f"copied {done['remote_segments_copied']} segments to {remote}")
            print(f"log start {log.log_start_offset}, local log start {log.local_log_start_offset}, "
                  f"local segments {len(log.segments)}")
            print(f"remote objects: {len(files(remote))}, e.g. {files(remote)[0]}")
            first = log.read(0, max_records=1)[0]  # from the object store, CRC-checked
            print(f"offset 0 reads back: {first.value[:16]!r}...")
            total = sum(1 for _ in log.iter())
            print(f"iterating the whole log: {total} records")
            try:
                table = log.read_arrow()
                print(f"read_arrow: {table.num_rows} rows across the remote and local segments")
            except ImportError:
                print("pyarrow is not installed: read_arrow skipped")
            metrics = store.metrics()
            print("RemoteLogSizeBytes:", metrics["kafka.server:type=BrokerTopicMetrics,name=RemoteLogSizeBytes"])
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
