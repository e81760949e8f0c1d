"""A store's tiered storage end to end over a local directory (``file://``): sealed segments
copied by the remote log manager and dropped from the local disk, every reader reading the same
records across the boundary, total retention and DeleteRecords expiring remote segments, topic
deletion emptying the object store, copies a crash cut short cleaned up, and an object store that
fails: appends and local reads go on, nothing local goes until a copy finishes."""

from __future__ import annotations

import os

import pytest

from logstore import LogStore, RemoteStorageError
from logstore.errors import InvalidConfigError
from logstore.tiered.metadata import LogSegmentData, RemoteLogSegmentId, RemoteLogSegmentMetadata, \
    RemoteLogSegmentState, TopicIdPartition
from logstore.tiered.storage import RemoteStorageManager

TOPIC_CONFIG = dict(segment_bytes=4096, remote_storage_enable=True, local_retention_bytes=0, retention_ms=-1,
                    local_retention_ms=-1)


def remote_files(root):
    out = []
    for dirpath, _, names in os.walk(root):
        out.extend(os.path.join(dirpath, n) for n in names)
    return out


@pytest.fixture
def remote_dir(tmp_path):
    path = tmp_path / "remote"
    path.mkdir()
    return path


def open_store(tmp_path, remote_dir, **kw):
    return LogStore(tmp_path / "data", maintenance=False, remote_storage=f"file://{remote_dir}", **kw)


def fill(store, topic="t", n=600, partitions=1):
    store.create_topic(topic, partitions, **TOPIC_CONFIG)
    for p in range(partitions):
        log = store.partition(topic, p)
        for i in range(n):
            log.append(f"{topic}-{p}-{i:05d}".encode() * 4, key=f"k{i}".encode(), timestamp=1_000_000 + i)
    return [store.partition(topic, p) for p in range(partitions)]


def test_sealed_segments_move_to_the_remote_tier_and_read_back_the_same(tmp_path, remote_dir):
    pytest.importorskip("pyarrow")
    with open_store(tmp_path, remote_dir) as store:
        (log,) = fill(store)
        before = [(r.offset, r.key, r.value, r.timestamp) for r in log.iter()]
        sealed = len(log.segments) - 1
        done = store.run_maintenance()
        assert done["remote_segments_copied"] == sealed and done["remote_errors"] == 0
        assert log.log_start_offset == 0 and log.local_log_start_offset > 500
        assert len(log.segments) == 1  # only the active segment is local
        assert [(r.offset, r.key, r.value, r.timestamp) for r in log.iter()] == before
        assert log.read(3, max_records=1)[0].value == b"t-0-00003" * 4
        assert log.read_arrow().num_rows == 600
        assert log.offset_for_timestamp(1_000_000 + 17) == 17
        metrics = store.metrics()
        assert metrics["kafka.server:type=BrokerTopicMetrics,name=RemoteCopyBytesPerSec"] > 0
        assert metrics["kafka.server:type=BrokerTopicMetrics,name=RemoteLogSizeBytes"] > 0
        assert metrics["kafka.log:type=RemoteLog,name=RemoteLogMetadataCount"] == {("t", 0): sealed}
        assert metrics["kafka.log:type=RemoteLog,name=RemoteCopyLagSegments"] == {("t", 0): 0}
        assert any(f.endswith(".log") for f in remote_files(remote_dir))
    # a new store object over the same directories reads everything back
    with open_store(tmp_path, remote_dir) as store:
        log = store.partition("t", 0)
        assert log.log_start_offset == 0
        assert [(r.offset, r.key, r.value, r.timestamp) for r in log.iter()] == before


def test_copies_wait_for_the_high_watermark(tmp_path, remote_dir):
    with open_store(tmp_path, remote_dir) as store:
        (log,) = fill(store)
        first_two = log.segments[2].base_offset
        log.high_watermark = first_two  # as a replica set's leader: the rest not yet on a majority
        store.run_maintenance()
        assert log.local_log_start_offset == first_two
        assert store.remote_log_manager.rlmm.remote_log_end_offset(store.remote_log_manager.partitions()[0]) == \
            first_two - 1


def test_total_retention_and_delete_records_expire_remote_segments(tmp_path, remote_dir):
    with open_store(tmp_path, remote_dir) as store:
        (log,) = fill(store)
        store.run_maintenance()
        manager = store.remote_log_manager
        (tp,) = manager.partitions()
        segments = [m for m in manager.rlmm.list_remote_log_segments(tp)
                    if m.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED]
        log.delete_records_before(segments[1].start_offset + 1)
        assert manager.expire_segments(log) == 1  # the first is wholly below the log start
        assert manager.rlmm.remote_log_start_offset(tp) == segments[1].start_offset
        # total retention by time: every remote segment's newest record is old
        store.alter_topic_config("t", lambda c: {**c, "retention.ms": "1000", "local.retention.ms": "1000"})
        gone = manager.expire_segments(log)
        assert gone == len(segments) - 1
        assert log.log_start_offset == segments[-1].end_offset + 1 == log.local_log_start_offset
        assert [r.offset for r in log.iter()][0] == log.log_start_offset
        assert not [f for f in remote_files(remote_dir) if f.endswith(".log")]


def test_deleting_the_topic_empties_the_remote_tier(tmp_path, remote_dir):
    with open_store(tmp_path, remote_dir) as store:
        fill(store, partitions=2, n=300)
        store.run_maintenance()
        assert remote_files(remote_dir)
        store.delete_topic("t")
        assert not remote_files(remote_dir)


def test_a_copy_cut_short_by_a_crash_is_cleaned_up(tmp_path, remote_dir):
    with open_store(tmp_path, remote_dir) as store:
        (log,) = fill(store)
        manager = store.remote_log_manager
        (tp,) = manager.partitions()
        # what a crash between "started" and "finished" leaves: the metadata and a partial upload
        c = log.segments_to_copy(0)[0]
        orphan = RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(tp), c.base_offset, c.end_offset,
                                          c.max_timestamp, 0, 1, c.size)
        manager.rlmm.add_remote_log_segment_metadata(orphan)
        manager.rsm.copy_log_segment_data(orphan, LogSegmentData(
            c.log_path, c.offset_index_path, c.time_index_path, c.txn_index_path, c.producer_snapshot_path,
            c.leader_epoch_checkpoint))
        uploaded = set(remote_files(remote_dir))
        assert uploaded
    with open_store(tmp_path, remote_dir) as store:
        log = store.partition("t", 0)
        done = store.run_maintenance()
        assert done["remote_errors"] == 0
        manager = store.remote_log_manager
        listed = {m.segment_id: m.state for m in manager.rlmm.list_remote_log_segments(manager.partitions()[0])}
        assert orphan.segment_id not in listed  # deleted (DELETE_SEGMENT_FINISHED: forgotten)
        assert not uploaded & set(remote_files(remote_dir))  # its objects went; the new copies are others
        assert set(listed.values()) == {RemoteLogSegmentState.COPY_SEGMENT_FINISHED}
        assert [r.offset for r in log.iter()] == list(range(600))


class Failing(RemoteStorageManager):
    """The default manager, with copies failing while ``down``."""

    def __init__(self, url):
        self.inner = RemoteStorageManager.from_url(url)
        self.down = True
        self.copies = 0

    def copy_log_segment_data(self, metadata, data):
        self.copies += 1
        if self.down:
            raise RemoteStorageError(f"{metadata.describe()}: the object store is down (test)")
        return self.inner.copy_log_segment_data(metadata, data)

    def fetch_log_segment(self, metadata, start_position, end_position=None):
        return self.inner.fetch_log_segment(metadata, start_position, end_position)

    def fetch_index(self, metadata, index_type):
        return self.inner.fetch_index(metadata, index_type)

    def delete_log_segment_data(self, metadata):
        return self.inner.delete_log_segment_data(metadata)

    def close(self):
        self.inner.close()


def test_an_object_store_that_is_down_loses_nothing_and_copies_resume(tmp_path, remote_dir):
    rsm = Failing(f"file://{remote_dir}")
    with LogStore(tmp_path / "data", maintenance=False, remote_storage=rsm,
                  remote_log_manager_task_interval_ms=10) as store:
        (log,) = fill(store)
        segments = len(log.segments)
        done = store.run_maintenance()
        assert done["remote_errors"] == 1 and done["remote_segments_copied"] == 0
        assert len(log.segments) == segments and log.local_log_start_offset == 0  # nothing local went
        log.append(b"more")  # appends and reads go on
        assert log.read(0, max_records=1)[0].offset == 0
        rsm.down = False
        manager = store.remote_log_manager
        assert manager.copy_segments(log) == len(log.segments) - 1 >= segments - 1
        log.enforce_retention()
        assert log.local_log_start_offset > 0
        assert [r.offset for r in log.iter()] == list(range(601))
        assert store.metrics()["kafka.server:type=BrokerTopicMetrics,name=RemoteCopyErrorsPerSec"] == 1


def test_remote_storage_needs_a_store_with_an_object_store_and_stays_on(tmp_path, remote_dir):
    with LogStore(tmp_path / "plain", maintenance=False) as store:
        with pytest.raises(InvalidConfigError, match="remote_storage"):
            store.create_topic("t", remote_storage_enable=True)
    with open_store(tmp_path, remote_dir) as store:
        store.create_topic("t", **TOPIC_CONFIG)
        with pytest.raises(InvalidConfigError, match="cannot be turned off"):
            store.alter_topic_config("t", lambda c: {**c, "remote.storage.enable": "false"})
        with pytest.raises(InvalidConfigError, match="compact"):
            store.create_topic("c", remote_storage_enable=True, cleanup_policy="compact")
        store.create_topic("later", segment_bytes=4096)
        log = store.partition("later", 0)
        for i in range(300):
            log.append(b"x" * 50)
        store.alter_topic_config("later", lambda c: {**c, "remote.storage.enable": "true", "local.retention.bytes": "0"})
        assert log.remote_tier is not None
        store.run_maintenance()
        assert log.local_log_start_offset > 0 and log.read(0, max_records=1)[0].offset == 0


def test_topic_partitions_of_the_metadata(tmp_path, remote_dir):
    with open_store(tmp_path, remote_dir) as store:
        fill(store, n=200)
        store.run_maintenance()
        assert "__remote_log_metadata" in store.topics(internal=True)
        assert store.describe("__remote_log_metadata").config.retention_ms == -1
        assert isinstance(store.remote_log_manager.partitions()[0], TopicIdPartition)


def test_the_store_remembers_its_remote_tier_without_credentials(tmp_path, remote_dir):
    from logstore.store.layout import read_remote_storage, remote_storage_text
    text = remote_storage_text("s3://b/p", {"secret_access_key": "hush", "session_token": "t", "region": "x"}).decode()
    assert "hush" not in text and "option.region=x" in text and "session_token" not in text
    with LogStore(tmp_path / "data", maintenance=False, remote_storage=f"file://{remote_dir}") as store:
        fill(store, n=300)
        store.run_maintenance()
    assert read_remote_storage(str(tmp_path / "data")) == (f"file://{remote_dir}", {})
    with LogStore(tmp_path / "data", maintenance=False) as store:  # no remote_storage given
        log = store.partition("t", 0)
        assert log.local_log_start_offset > 0
        assert [r.offset for r in log.iter()] == list(range(300))


def test_both_managers_are_replaceable(tmp_path, remote_dir):
    from logstore.tiered.rlmm import TopicBasedRemoteLogMetadataManager

    events = []

    class Counting(TopicBasedRemoteLogMetadataManager):
        def add_remote_log_segment_metadata(self, metadata):
            events.append(("add", metadata.start_offset))
            super().add_remote_log_segment_metadata(metadata)

    class Mine(Failing):  # the object store manager of the user's own, here one that works
        def __init__(self, url):
            super().__init__(url)
            self.down = False

    rsm = Mine(f"file://{remote_dir}")
    with LogStore(tmp_path / "data", maintenance=False, remote_storage=rsm,
                  remote_log_metadata_manager=Counting) as store:
        (log,) = fill(store, n=300)
        store.run_maintenance()
        assert isinstance(store.remote_log_manager.rlmm, Counting)
        offsets = [offset for _, offset in events]
        assert offsets[0] == 0 and offsets == sorted(set(offsets))  # each sealed segment once, in order
        assert rsm.copies == len(events) > 0
        assert [r.offset for r in log.iter()] == list(range(300))
    assert not (tmp_path / "data" / ".remote-storage").exists()  # a user's own manager is not remembered


# ---------------------------------------------------------------------- the review's findings


def test_delete_records_inside_a_segment_not_yet_copied_loses_nothing(tmp_path, remote_dir):
    with open_store(tmp_path, remote_dir) as store:
        (log,) = fill(store)
        first = log.segments[0]
        cut = first.base_offset + (first.next_offset - first.base_offset) // 2
        log.delete_records_before(cut)
        store.run_maintenance()
        assert log.local_log_start_offset > first.next_offset  # copied (the straddling one too) and dropped
        assert [r.offset for r in log.iter()] == list(range(cut, 600))
        assert log.read(cut, max_records=1)[0].offset == cut
        assert log.read_arrow().column("offset").to_pylist() == list(range(cut, 600))


def test_a_lost_log_start_checkpoint_takes_the_remote_start_and_deletes_nothing(tmp_path, remote_dir):
    with open_store(tmp_path, remote_dir) as store:
        fill(store)
        store.run_maintenance()
        count = len(store.remote_log_manager.rlmm.list_remote_log_segments(store.remote_log_manager.partitions()[0]))
    (tmp_path / "data" / "log-start-offset-checkpoint").write_text("garbage\n")
    with open_store(tmp_path, remote_dir) as store:
        log = store.partition("t", 0)
        assert log.log_start_offset == 0
        store.run_maintenance()
        manager = store.remote_log_manager
        assert len(manager.rlmm.list_remote_log_segments(manager.partitions()[0])) == count
        assert [r.offset for r in log.iter()] == list(range(600))


def test_remote_reads_with_small_budgets_and_limits(tmp_path, remote_dir):
    with open_store(tmp_path, remote_dir) as store:
        (log,) = fill(store)
        store.run_maintenance()
        local = log.local_log_start_offset
        for offset in range(0, local, 7):
            raw = log.read_raw(offset, 50)  # at least the batch holding it, whole
            assert raw and log.read(offset, max_bytes=50)[0].offset == offset
        assert [r.offset for r in log.read(100, max_offset=101)] == [100]
        assert [r.offset for r in log.iter(63, 101)] == list(range(63, 101))


def test_an_arrow_read_survives_local_retention_during_it(tmp_path, remote_dir):
    with open_store(tmp_path, remote_dir) as store:
        (log,) = fill(store)
        manager = store.remote_log_manager
        half = log.segments[len(log.segments) // 2].base_offset
        log.high_watermark = half
        manager.copy_segments(log)
        log.enforce_retention()
        assert log.local_log_start_offset == half
        batches = log.iter_arrow()
        seen = next(batches).column("offset").to_pylist()  # the remote part
        log.high_watermark = log.log_end_offset
        manager.copy_segments(log)  # meanwhile the rest is copied and leaves the local disk
        log.enforce_retention()
        assert log.local_log_start_offset > half
        for batch in batches:
            seen.extend(batch.column("offset").to_pylist())
        assert seen == list(range(600))


def test_the_copying_process_tiers_partitions_only_others_write(tmp_path, remote_dir):
    a = open_store(tmp_path, remote_dir)
    b = open_store(tmp_path, remote_dir)
    try:
        assert a.remote_log_manager is not None
        a.run_maintenance()  # a takes the copier's role (it holds .lock-remote-log-manager)
        (log_b,) = fill(b, topic="bt")
        sealed = len(log_b.segments) - 1
        assert b.run_maintenance()["remote_segments_copied"] == 0  # b follows
        assert a.run_maintenance()["remote_segments_copied"] == sealed
        b.run_maintenance()
        assert log_b.local_log_start_offset > 0  # b's local retention saw the copies
        assert [r.offset for r in log_b.iter()] == list(range(600))
    finally:
        b.close()
        a.close()


def test_remote_storage_is_no_store_default(tmp_path, remote_dir):
    with pytest.raises(InvalidConfigError, match="per topic"):
        LogStore(tmp_path / "x", maintenance=False, remote_storage=f"file://{remote_dir}", remote_storage_enable=True)
    with open_store(tmp_path, remote_dir) as store:
        with pytest.raises(InvalidConfigError, match="per topic"):
            store.alter_defaults(lambda d: {**d, "remote.storage.enable": "true"})
        store.alter_defaults(lambda d: {**d, "local.retention.ms": "60000"})  # local retention may be


def test_a_deleted_topics_remote_segments_go_at_a_later_round(tmp_path, remote_dir):
    class NoDeletes(Failing):
        def __init__(self, url):
            super().__init__(url)
            self.down = False

        def delete_log_segment_data(self, metadata):
            raise RemoteStorageError(f"{metadata.describe()}: deletes fail (test)")

    with LogStore(tmp_path / "data", maintenance=False, remote_storage=NoDeletes(f"file://{remote_dir}")) as store:
        fill(store, n=300)
        store.run_maintenance()
        store.delete_topic("t")
        assert remote_files(remote_dir)  # left behind: the object store refused
    with open_store(tmp_path, remote_dir) as store:  # the next open finishes it
        store.run_maintenance()
        assert not remote_files(remote_dir)


def test_remote_segments_name_a_leader_epoch(tmp_path, remote_dir):
    with open_store(tmp_path, remote_dir) as store:
        fill(store, n=300)
        store.run_maintenance()
        manager = store.remote_log_manager
        for m in manager.rlmm.list_remote_log_segments(manager.partitions()[0]):
            assert m.segment_leader_epochs == {0: m.start_offset}


def test_the_tier_command_copies_with_progress_and_reports(tmp_path, remote_dir):
    import io
    import json

    from logstore.cli import main

    with open_store(tmp_path, remote_dir) as store:
        fill(store, partitions=2, n=300)
        store.create_topic("plain")
        sealed = sum(len(store.partition("t", p).segments) - 1 for p in range(2))
    out = io.StringIO()
    assert main(["tier", str(tmp_path / "data"), "--json"], stdout=out) == 0
    rows = json.loads(out.getvalue())
    assert [r["partition"] for r in rows] == ["t-0", "t-1"]  # the tiered topic only
    assert sum(r["segments_copied"] for r in rows) == sealed
    assert all(r["local_log_start_offset"] > 0 == r["log_start_offset"] for r in rows)
    out = io.StringIO()
    assert main(["tier", str(tmp_path / "data")], stdout=out) == 0
    assert out.getvalue().endswith("copied 0 segment(s) of 2 partition(s)\n")  # nothing left to copy
    err = io.StringIO()
    assert main(["tier", str(tmp_path / "data"), "plain"], stdout=err) == 1
    with LogStore(tmp_path / "data", maintenance=False) as store:
        assert [r.offset for r in store.partition("t", 1).iter()] == list(range(300))


def test_an_aborted_transaction_whose_marker_is_in_a_later_segment_stays_hidden(tmp_path, remote_dir):
    """Its entry is in the index of the segment holding its marker: a read of its first records
    (remote) must find it past the range read, as Kafka's collectAbortedTransactions does."""
    from logstore.kafka.remotefetch import _read

    with open_store(tmp_path, remote_dir) as store:
        store.create_topic("tx", segment_bytes=1024, remote_storage_enable=True, local_retention_bytes=0,
                           retention_ms=-1, local_retention_ms=-1)
        log = store.partition("tx", 0)
        for i in range(30):  # one transaction over several segments, aborted at the end
            log.append_batch([b"aborted-%d" % i + b"x" * 50], producer_id=1, producer_epoch=0, base_sequence=i,
                             transactional=True)
        log.append_txn_marker(1, 0, commit=False)
        for i in range(60):
            log.append(b"plain %d" % i + b"y" * 50)
        store.run_maintenance()
        assert log.local_log_start_offset > 31  # the transaction and its marker are remote
        assert [t.producer_id for t in log.aborted_transactions(0, 5)] == [1]
        _, aborted = _read(log, 0, 1 << 20, log.high_watermark, True)
        assert [a["producer_id"] for a in aborted] == [1]
        committed = [r.value for r in log.iter(isolation_level="read_committed")]
        assert len(committed) == 60 and not any(v.startswith(b"aborted") for v in committed)


def test_dump_prints_a_tiered_partitions_remote_segments_and_their_batches(tmp_path, remote_dir):
    import io
    import json

    from logstore.cli import main

    with open_store(tmp_path, remote_dir) as store:
        (log,) = fill(store, n=300)
        store.run_maintenance()
        local = log.local_log_start_offset
    out = io.StringIO()
    assert main(["dump", str(tmp_path / "data" / "t-0"), "--remote", "--deep", "--json"], stdout=out) == 0
    items = [json.loads(line) for line in out.getvalue().splitlines()]
    segments = [i for i in items if i["kind"] == "remote-segment"]
    assert segments[0]["start_offset"] == 0 and segments[-1]["end_offset"] == local - 1
    assert all(s["state"] == "COPY_SEGMENT_FINISHED" and s["object"].endswith(".log") for s in segments)
    offsets = [r["offset"] for i in items if i["kind"] == "batch" for r in i["records"]]
    assert offsets == list(range(local))
    first = next(i for i in items if i["kind"] == "batch")
    assert first["position"] == 0 and first["crc_valid"]
    text = io.StringIO()
    assert main(["dump", str(tmp_path / "data" / "t-0"), "--remote", "--print-data"], stdout=text) == 0
    assert "remote segment " in text.getvalue() and "payload: t-0-00003" in text.getvalue()
    assert main(["dump", str(tmp_path / "data" / "t-0"), "--remote", "--remote-storage",
                 f"file://{tmp_path}/nowhere"], stdout=io.StringIO()) == 1  # an object store without them
