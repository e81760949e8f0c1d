"""The read-only view of a tiered partition's remote tier (store.remoteview, StoreView.remote_tier),
against what the store's own log and remote log manager say: the remote segments listed, the log
start below the local segments, reads decoded the same as Log.read, damage and loss reported
naming the remote segment."""

from __future__ import annotations

import os

import pytest

from logstore import LogStore, RemoteStorageError
from logstore.errors import DataLossError, LogstoreError
from logstore.records.batch import RecordDecoder
from logstore.store.views import StoreView
from logstore.tiered.storage import LOG_SUFFIX, object_key

TOPIC_CONFIG = dict(segment_bytes=4096, remote_storage_enable=True, local_retention_bytes=0, retention_ms=-1,
                    local_retention_ms=-1)


@pytest.fixture
def tiered(tmp_path):
    """A store with topic "t" (2 partitions) whose first 600 records per partition are in a
    file:// remote tier and the next 100 local, and a plain topic "plain"; returns (root,
    remote directory, {partition: [(offset, key, value, timestamp)]}, what the logs said)."""
    root, remote = str(tmp_path / "data"), tmp_path / "remote"
    expected, said = {}, {}
    with LogStore(root, maintenance=False, remote_storage=f"file://{remote}") as store:
        store.create_topic("t", 2, **TOPIC_CONFIG)
        store.create_topic("plain", 1, segment_bytes=4096)
        for p in range(2):
            log = store.partition("t", p)
            for i in range(600):
                log.append(b"v%d-%05d" % (p, i) * 4, key=b"k%d" % i, timestamp=1_000_000 + i)
        store.run_maintenance()
        manager = store.remote_log_manager
        for p in range(2):
            log = store.partition("t", p)
            for i in range(600, 700):
                log.append(b"v%d-%05d" % (p, i) * 4, key=b"k%d" % i, timestamp=1_000_000 + i)
            expected[p] = [(r.offset, r.key, r.value, r.timestamp) for r in log.iter()]
            tp = next(tp for tp in manager.partitions() if tp.partition == p)
            said[p] = (log.log_start_offset, log.local_log_start_offset,
                       [m for m in manager.rlmm.list_remote_log_segments(tp) if m.state.name == "COPY_SEGMENT_FINISHED"])
        for i in range(50):
            store.partition("plain", 0).append(b"x" * 100)
    return root, remote, expected, said


def records_of(remote, start, end):
    decoded = []
    decoder = RecordDecoder()
    for _ in remote.scan(start, end, lambda buf, out, n: decoded.append(n), decoder):
        pass
    raw, offset, out = b"", start, []
    while offset < end:
        raw = remote.read_batches(offset, 1 << 20)
        if not raw:
            break
        records, _ = RecordDecoder().decode(raw, 0, len(raw), offset, end)
        out += [(r.offset, r.key, r.value, r.timestamp) for r in records if r.offset < end]
        offset = out[-1][0] + 1
    return sum(decoded), out


def test_the_remote_segments_and_offsets_are_the_stores(tiered):
    root, remote_dir, expected, said = tiered
    view = StoreView(root)
    for p in range(2):
        log_start, local_start, finished = said[p]
        partition = view.partition("t", p)
        remote = partition.remote
        assert remote is not None and list(remote.segments) == finished and len(finished) > 3
        assert remote.url == f"file://{remote_dir}"  # remembered by the store (.remote-storage)
        assert partition.segments()[0] == local_start > 500
        assert partition.log_start_offset() == log_start == 0  # below the first local segment
        assert partition.local_log_start_offset() == local_start
        assert remote.start_offset == 0 and remote.end_offset == local_start - 1
        assert remote.size_in_bytes == sum(m.segment_size_in_bytes for m in finished)
    assert view.partition("plain", 0).remote is None
    assert view.remote_tier("plain", 0) is None
    assert view.partition("plain", 0).log_start_offset() == 0


def test_remote_reads_give_the_logs_records(tiered):
    root, _, expected, said = tiered
    view = StoreView(root).partition("t", 1)
    local_start = said[1][1]
    rows, records = records_of(view.remote, 0, local_start)
    assert records == expected[1][:local_start]
    assert rows == local_start
    rows, records = records_of(view.remote, 123, 321)
    assert records == expected[1][123:321]
    assert view.remote.offset_for_timestamp(1_000_017) == 17
    assert view.timestamp_bounds(1_000_017)[0] <= 17 <= view.timestamp_bounds(1_000_017)[1]
    assert view.timestamp_bounds(1_000_650)[0] >= local_start  # past the remote segments: the local ones
    with pytest.raises(DataLossError, match="no longer on local disk"):
        next(view.scan(0, 700, lambda *a: None))


def test_a_damaged_remote_batch_raises_naming_the_remote_segment(tiered):
    root, remote_dir, _, _ = tiered
    remote = StoreView(root).partition("t", 0).remote
    damaged = remote.segments[1]
    path = os.path.join(remote_dir, object_key(damaged, LOG_SUFFIX))
    with open(path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(RemoteStorageError, match=f"remote segment t-0 \\[{damaged.start_offset}\\.\\.") as caught:
        records_of(remote, 0, remote.end_offset + 1)
    assert str(damaged.segment_id.id) in str(caught.value) and "crc" in str(caught.value).lower()
    # the segment before it reads as it is
    assert len(records_of(remote, 0, damaged.start_offset)[1]) == damaged.start_offset


def test_a_remote_segment_gone_is_data_loss_or_skipped(tiered):
    root, remote_dir, expected, _ = tiered
    remote = StoreView(root).partition("t", 0).remote
    lost = remote.segments[0]
    os.unlink(os.path.join(remote_dir, object_key(lost, LOG_SUFFIX)))
    with pytest.raises(DataLossError, match="gone from the remote tier"):
        for _ in remote.scan(0, 100, lambda *a: None):
            pass
    got = []
    for _ in remote.scan(0, remote.end_offset + 1, lambda buf, out, n: got.append(n), skip_lost=True):
        pass
    assert sum(got) == remote.end_offset - lost.end_offset  # every row but the lost segment's


def test_the_object_store_given_wins_and_an_unknown_one_is_named(tiered, tmp_path):
    root, remote_dir, _, _ = tiered
    os.rename(remote_dir, tmp_path / "moved")
    moved = StoreView(root, remote_storage=f"file://{tmp_path / 'moved'}").partition("t", 0).remote
    assert moved.url == f"file://{tmp_path / 'moved'}"
    assert records_of(moved, 0, 10)[1][0][0] == 0
    os.unlink(os.path.join(root, ".remote-storage"))
    unknown = StoreView(root).partition("t", 0).remote
    with pytest.raises(LogstoreError, match="remoteStorage"):
        unknown.read_batches(0, 100)


def cli(*argv):
    import io

    from logstore.cli import main

    out = io.StringIO()
    return main(list(argv), stdout=out), out.getvalue()


def test_stats_show_the_remote_tier_and_the_bytes_to_copy(tiered):
    import json

    root, _, _, said = tiered
    code, text = cli("stats", root, "--json")
    rows = {(r["topic"], r["partition"]): r for r in json.loads(text)}
    for p in range(2):
        row = rows[("t", p)]
        assert row["log_start_offset"] == 0 and row["local_log_start_offset"] == said[p][1]
        assert row["remote_segments"] == len(said[p][2])
        assert row["remote_bytes"] == sum(m.segment_size_in_bytes for m in said[p][2])
        assert row["copy_lag_bytes"] > 0  # the 100 records appended after the copy filled sealed segments
    assert rows[("plain", 0)]["remote_segments"] is None
    code, text = cli("stats", root)
    assert code == 0 and f"remote tier: {len(said[0][2])} segments" in text


def test_verify_remote_reads_every_remote_batch(tiered):
    root, remote_dir, expected, said = tiered
    code, text = cli("verify", root, "--remote")
    assert code == 0 and text.endswith("OK\n"), text
    damaged = said[1][2][2]
    with open(os.path.join(remote_dir, object_key(damaged, LOG_SUFFIX)), "r+b") as f:
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0x01]))
    assert cli("verify", root)[0] == 0  # the local files are intact
    code, text = cli("verify", root, "--remote")
    problems = [line for line in text.splitlines() if line.startswith("PROBLEM")]
    assert code == 1 and len(problems) == 1
    assert f"remote segment t-1 [{damaged.start_offset}..{damaged.end_offset}] id {damaged.segment_id.id}" in problems[0]


def test_a_view_follows_copies_made_after_it(tiered):
    root, _, _, said = tiered
    view = StoreView(root)
    before = view.partition("t", 0).remote
    assert view.partition("t", 0).remote is before  # nothing changed: the same view, its index cache
    with LogStore(root, maintenance=False) as store:  # the remembered remote tier
        log = store.partition("t", 0)
        for i in range(300):
            log.append(b"more %d" % i * 10)
        store.run_maintenance()
        local_start = log.local_log_start_offset
    after = view.partition("t", 0)
    assert len(after.remote.segments) > len(before.segments) and after.remote.segments[:len(before.segments)] == \
        before.segments
    assert after.local_log_start_offset() == local_start == after.remote.end_offset + 1
