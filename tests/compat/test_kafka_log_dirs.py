"""A broker's log directory, as Apache Kafka leaves it, opened by logstore.

The directory is built the way a Kafka 3.x broker (KRaft) leaves one of its ``log.dirs`` after a
clean shutdown: ``meta.properties``, ``.lock``, ``.kafka_cleanshutdown``, the four offset
checkpoint files, partition directories holding the segment Apache Kafka wrote
(``tests/fixtures/kafka/``) with trimmed indexes, ``leader-epoch-checkpoint``,
``partition.metadata`` and a producer-state ``.snapshot``; partition 1 of ``orders`` lives on
another broker (a gap); Kafka's 50-partition ``__consumer_offsets``; a deleted, a future and a
stray replica; the KRaft metadata log. Offset commits in Kafka's own schema are written here
with struct, not with logstore.groups.offsets, and batches with kafka-python's builder.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pathlib
import struct
import subprocess
import sys
import textwrap
import uuid

import pytest

from logstore import LogStore
from logstore.cli import main
from logstore.errors import LogLockedError, UnknownTopicOrPartitionError
from logstore.store.kafkadirs import OFFSETS_ASIDE_DIR, OFFSETS_TOPIC_OVERRIDES, scan
from logstore.store.views import StoreView
from logstore.tools import stats, verify

kafka_records = pytest.importorskip("kafka.record")
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402
from kafka.record.util import calc_crc32c  # noqa: E402

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "kafka" / "cluster-metadata-00000000000000000000.log"
SEGMENT = "00000000000000000000"
FIXTURE_VALUE_SIZES = [23, 24, 65, 65]
MAX_TS, MAX_TS_OFFSET = 1726045957397, 3


def _checkpoint(entries: list[tuple[str, int, int]]) -> str:
    return "0\n" + f"{len(entries)}\n" + "".join(f"{t} {p} {o}\n" for t, p, o in entries)


def _snapshot() -> bytes:
    """A producer-state snapshot with no producers: version 1, CRC32C of what follows, an
    empty producer array."""
    body = struct.pack(">i", 0)
    return struct.pack(">hI", 1, calc_crc32c(body)) + body


def _partition(root: pathlib.Path, name: str, segment: bytes | None = None, epoch: int = 1) -> pathlib.Path:
    """A partition directory as a Kafka broker leaves it after a clean shutdown."""
    part = root / name
    part.mkdir()
    data = FIXTURE.read_bytes() if segment is None else segment
    (part / f"{SEGMENT}.log").write_bytes(data)
    (part / f"{SEGMENT}.index").write_bytes(b"")  # under index.interval.bytes: no entry, trimmed
    # Closing the active segment appends its largest timestamp to the time index.
    (part / f"{SEGMENT}.timeindex").write_bytes(struct.pack(">qi", MAX_TS, MAX_TS_OFFSET) if segment is None else b"")
    (part / "leader-epoch-checkpoint").write_text(f"0\n1\n{epoch} 0\n")
    (part / "partition.metadata").write_text("version: 0\ntopic_id: 6zOrJqXzRGaOFBVjEtnVdA\n")
    end = 4 if segment is None else 0
    (part / f"{end:020d}.snapshot").write_bytes(_snapshot())
    return part


def make_kafka_log_dir(root: pathlib.Path, offsets_partitions: int = 50) -> pathlib.Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "meta.properties").write_text(textwrap.dedent("""\
        #
        #Wed Sep 11 09:12:20 UTC 2024
        node.id=1
        directory.id=QKdzR3ycTS6QMxC4tR_P1g
        version=1
        cluster.id=4L6g3nShT-eMCtK--X86sw
        """))
    (root / ".lock").write_bytes(b"")
    (root / ".kafka_cleanshutdown").write_text('{"version":0,"brokerEpoch":12}')
    _partition(root, "orders-0")
    _partition(root, "orders-2")
    for p in range(offsets_partitions):
        _partition(root, f"__consumer_offsets-{p}", segment=b"")
    _partition(root, f"orders-1.{uuid.uuid4().hex}-delete")
    _partition(root, f"orders-0.{uuid.uuid4().hex}-future")
    _partition(root, f"payments-0.{uuid.uuid4().hex}-stray")
    meta = _partition(root, "__cluster_metadata-0")
    (meta / "quorum-state").write_text('{"clusterId":"","leaderId":1,"leaderEpoch":1,"votedId":-1,'
                                       '"appliedOffset":0,"currentVoters":null,"data_version":0}')
    offsets = [("__consumer_offsets", p, 0) for p in range(offsets_partitions)]
    (root / "recovery-point-offset-checkpoint").write_text(_checkpoint([("orders", 0, 4), ("orders", 2, 4)] + offsets))
    (root / "log-start-offset-checkpoint").write_text(_checkpoint([]))
    (root / "replication-offset-checkpoint").write_text(_checkpoint([("orders", 0, 4), ("orders", 2, 4)] + offsets))
    (root / "cleaner-offset-checkpoint").write_text(_checkpoint([]))
    return root


def tree(root: pathlib.Path) -> dict[str, bytes | None]:
    """Every entry under ``root``: file contents, None for directories."""
    out: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        out[str(path.relative_to(root))] = None if path.is_dir() else path.read_bytes()
    return out


# ---------------------------------------------------------------------- offset commits in Kafka's schema
def _kstr(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def commit_key(group: str, topic: str, partition: int, version: int = 1) -> bytes:
    return struct.pack(">h", version) + _kstr(group) + _kstr(topic) + struct.pack(">i", partition)


def commit_value(offset: int, version: int = 3, ts: int = 1726045960000) -> bytes:
    if version == 3:
        return struct.pack(">hqi", 3, offset, -1) + _kstr("") + struct.pack(">q", ts)
    if version == 2:
        return struct.pack(">hq", 2, offset) + _kstr("") + struct.pack(">q", ts)
    assert version == 1
    return struct.pack(">hq", 1, offset) + _kstr("") + struct.pack(">qq", ts, -1)


def group_metadata_key(group: str) -> bytes:
    return struct.pack(">h", 2) + _kstr(group)


def batch(records: list[tuple[bytes, bytes | None]], base_offset: int, transactional: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, transactional, 7 if transactional else -1, 0 if transactional else -1,
                                        0 if transactional else -1, 1 << 20)
    for i, (key, value) in enumerate(records):
        builder.append(i, timestamp=1726045960000 + i, key=key, value=value, headers=[])
    out = bytearray(builder.build())
    out[0:8] = base_offset.to_bytes(8, "big")  # the base offset lies outside the CRC
    return bytes(out)


def offsets_segment(*batches: list[tuple[bytes, bytes | None]], transactional_last: bool = False) -> bytes:
    out, offset = b"", 0
    for i, records in enumerate(batches):
        out += batch(records, offset, transactional=transactional_last and i == len(batches) - 1)
        offset += len(records)
    return out


# ---------------------------------------------------------------------- read-only: views, stats, CLI
def test_store_view_adopts_partition_directories_without_writing(tmp_path):
    root = make_kafka_log_dir(tmp_path / "kafka")
    before = tree(root)
    view = StoreView(root)
    assert view.kafka_log_dir
    assert view.topics() == ["orders"]
    assert view.topics(internal=True) == ["orders"]  # Kafka's 50-partition offsets topic is skipped
    assert view.partitions("orders") == 3
    assert view.overrides("orders") == {}
    assert view.partition("orders", 1).segments() == []  # the gap reads as an empty partition
    p0 = view.partition("orders", 0)
    assert (p0.log_start_offset(), p0.log_end_offset(), p0.high_watermark()) == (0, 4, 4)
    with pytest.raises(UnknownTopicOrPartitionError, match="no partition 3"):
        view.partition("orders", 3)
    with pytest.raises(UnknownTopicOrPartitionError, match="'payments' does not exist"):
        view.partitions("payments")
    assert tree(root) == before


def test_stats_on_a_kafka_log_dir_reads_the_kafka_segments_and_writes_nothing(tmp_path):
    root = make_kafka_log_dir(tmp_path / "kafka")
    before = tree(root)
    rows = {(s.topic, s.partition): s for s in stats(str(root))}
    assert sorted(rows) == [("orders", 0), ("orders", 1), ("orders", 2)]
    for p in (0, 2):
        s = rows[("orders", p)]
        assert (s.log_start_offset, s.log_end_offset, s.segments, s.batches, s.records, s.bytes) == (0, 4, 1, 2, 4, 331)
    assert (rows[("orders", 1)].segments, rows[("orders", 1)].log_end_offset) == (0, 0)
    assert tree(root) == before


def test_stats_on_one_kafka_partition_directory(tmp_path):
    root = make_kafka_log_dir(tmp_path / "kafka")
    before = tree(root)
    rows = stats(str(root / "orders-2"))
    assert [(s.topic, s.partition, s.log_end_offset, s.records) for s in rows] == [("orders", 2, 4, 4)]
    assert tree(root) == before


def test_cli_stats_and_topics_list_on_a_kafka_log_dir_and_a_partition_dir(tmp_path, capsys):
    root = make_kafka_log_dir(tmp_path / "kafka")
    before = tree(root)
    assert main(["stats", str(root), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["orders-0", "orders-1", "orders-2"]
    assert main(["stats", str(root / "orders-0"), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].split()[:3] == ["orders-0", "0", "4"]
    assert main(["topics", "list", str(root)]) == 0
    assert capsys.readouterr().out == "orders\n"
    assert main(["topics", "list", str(root / "orders-2")]) == 0
    assert capsys.readouterr().out == "orders\n"
    assert main(["topics", "describe", str(root), "orders", "--json"]) == 0
    assert '"partitions": 3' in capsys.readouterr().out
    assert main(["verify", str(root), "--quiet"]) == 0
    assert capsys.readouterr().out.endswith("OK\n")
    assert tree(root) == before


def test_skipped_directories_are_logged_with_their_reason(tmp_path, caplog):
    root = make_kafka_log_dir(tmp_path / "kafka")
    (root / "bad topic-0").mkdir()
    (root / "orders-007").mkdir()
    with caplog.at_level(logging.INFO, logger="logstore.store.kafkadirs"):
        found = scan(str(root))
    reasons = {s.name.split(".")[0] if "." in s.name else s.name: s.reason for s in found.skipped}
    assert "deleted partition" in reasons["orders-1"]
    assert "between log directories" in reasons["orders-0"]
    assert "should no longer hold" in reasons["payments-0"]
    assert "KRaft metadata log" in reasons["__cluster_metadata-0"]
    assert "contains ' '" in reasons["bad topic-0"]
    assert "leading zero" in reasons["orders-007"]
    assert "partition 0 (Kafka places a group" in reasons["__consumer_offsets-17"]
    assert found.foreign_offsets == tuple(f"__consumer_offsets-{p}" for p in range(50))
    text = caplog.text
    assert "skipping bad topic-0" in text and "not adopting __consumer_offsets (50 partition directories)" in text
    assert "topic orders has no directory for partition(s) 1" in text


# ---------------------------------------------------------------------- LogStore: adoption for good
def test_log_store_adopts_writes_topic_files_and_moves_kafka_offsets_aside(tmp_path):
    root = make_kafka_log_dir(tmp_path / "kafka")
    view_topics = StoreView(root).topics(internal=True)
    with LogStore(root, maintenance=False) as store:
        assert store.adopted == ("orders",)
        assert store.topics(internal=True) == view_topics == ["orders"]
        assert store.describe("orders").partitions == 3
        assert [len(r.value) for r in store.partition("orders", 0).read(0)] == FIXTURE_VALUE_SIZES
        assert store.partition("orders", 1).log_end_offset == 0  # the gap: an empty partition
        # The store's consumer groups start clean, in their own __consumer_offsets.
        with store.consumer("g", "orders") as consumer:
            got = consumer.poll(1.0, max_records=100)
            assert sorted((r.partition, r.offset) for r in got) == [(p, o) for p in (0, 2) for o in range(4)]
            consumer.commit()
    # The topic keeps the id of Kafka's partition.metadata (KIP-516); the gap partition gets its copy.
    assert (root / ".topics" / "orders").read_text() == "partitions=3\ntopic.id=6zOrJqXzRGaOFBVjEtnVdA\n"
    assert (root / "orders-1" / "partition.metadata").read_text() == "version: 0\ntopic_id: 6zOrJqXzRGaOFBVjEtnVdA"
    aside = sorted(os.listdir(root / OFFSETS_ASIDE_DIR))
    assert aside == sorted(f"__consumer_offsets-{p}" for p in range(50))
    assert sorted(os.listdir(root / "__consumer_offsets-0")) != []  # logstore's own, created on first use
    assert (root / "__cluster_metadata-0").is_dir()
    assert any(name.endswith("-future") for name in os.listdir(root))
    assert any(name.endswith("-stray") for name in os.listdir(root))
    # A writer finishes Kafka's pending deletions, as the broker would have.
    assert not any(name.endswith("-delete") for name in os.listdir(root))
    with LogStore(root, maintenance=False) as store:
        assert store.adopted == ()
        assert store.topic_id("orders") == uuid.UUID(bytes=base64.urlsafe_b64decode("6zOrJqXzRGaOFBVjEtnVdA=="))
        assert store.consumer("g", "orders").committed("orders", 2) == 4
        assert StoreView(root).topics(internal=True) == store.topics(internal=True) == ["__consumer_offsets", "orders"]


def test_adopted_gap_partition_takes_appends(tmp_path):
    root = make_kafka_log_dir(tmp_path / "kafka", offsets_partitions=0)
    with LogStore(root, maintenance=False) as store:
        assert store.partition("orders", 1).append(b"mine") == 0
    assert [s.log_end_offset for s in stats(str(root))] == [4, 1, 4]


def test_compatible_kafka_consumer_offsets_become_the_internal_topic(tmp_path):
    root = make_kafka_log_dir(tmp_path / "kafka", offsets_partitions=0)
    segment = offsets_segment(
        [(group_metadata_key("g"), b"\x00\x03opaque group metadata")],
        [(commit_key("g", "orders", 0), commit_value(1)), (commit_key("g", "orders", 2), commit_value(3, version=1))],
        [(commit_key("g", "orders", 0), commit_value(2, version=3))],
        [(commit_key("old", "orders", 0), commit_value(1)), (commit_key("old", "orders", 0), None)],
    )
    _partition(root, "__consumer_offsets-0", segment=segment)
    view = StoreView(root)
    assert view.topics(internal=True) == ["__consumer_offsets", "orders"]
    assert view.overrides("__consumer_offsets") == dict(OFFSETS_TOPIC_OVERRIDES)
    lag = {(s.topic, s.partition): s.group_lag for s in stats(str(root))}
    assert lag[("orders", 0)] == {"g": 2} and lag[("orders", 2)] == {"g": 1}
    with LogStore(root, maintenance=False) as store:
        assert store.adopted == ("__consumer_offsets", "orders")
        assert store.describe("__consumer_offsets").config.cleanup_policy == "compact"
        with store.consumer("g", "orders", enable_auto_commit=False) as consumer:
            # The group resumes where Kafka's consumers committed.
            assert consumer.committed("orders", 0) == 2 and consumer.committed("orders", 2) == 3
            assert consumer.committed("orders", 1) is None
    assert not (root / OFFSETS_ASIDE_DIR).exists()


def marker(producer_id: int, commit: bool, base_offset: int) -> bytes:
    """A COMMIT or ABORT marker batch, packed by hand from Kafka's schema (bits 4 and 5, one
    control record: key version 0 and type, value version 0 and coordinator epoch 0)."""
    key, value = struct.pack(">hh", 0, 1 if commit else 0), struct.pack(">hi", 0, 0)

    def varint(n: int) -> bytes:
        n = (n << 1) ^ (n >> 63)
        out = b""
        while n >= 0x80:
            out += bytes([(n & 0x7F) | 0x80])
            n >>= 7
        return out + bytes([n])

    body = b"\x00" + varint(0) + varint(0) + varint(len(key)) + key + varint(len(value)) + value + varint(0)
    record = varint(len(body)) + body
    after_crc = struct.pack(">hiqqqhii", 0x30, 0, 1726045960000, 1726045960000, producer_id, 0, -1, 1) + record
    head = struct.pack(">qii", base_offset, 4 + 1 + 4 + len(after_crc), 0) + b"\x02"
    return head + struct.pack(">I", calc_crc32c(after_crc)) + after_crc


def test_transactional_commits_in_kafkas_offsets_topic_apply_at_their_markers(tmp_path):
    """A Kafka offsets partition holding transactional commits (Kafka's TxnOffsetCommit) is
    adopted: a committed transaction's offsets apply, an aborted one's and an open one's do not."""
    root = make_kafka_log_dir(tmp_path / "kafka", offsets_partitions=0)
    segment = (batch([(commit_key("g", "orders", 0), commit_value(1))], 0)
               + batch([(commit_key("g", "orders", 0), commit_value(3))], 1, transactional=True)   # producer 7
               + marker(7, True, 2)
               + batch([(commit_key("g", "orders", 2), commit_value(8))], 3, transactional=True)
               + marker(7, False, 4))
    _partition(root, "__consumer_offsets-0", segment=segment)
    lag = {(s.topic, s.partition): s.group_lag for s in stats(str(root))}
    assert lag[("orders", 0)] == {"g": 1} and lag[("orders", 2)] == {}
    with LogStore(root, maintenance=False) as store:
        assert "__consumer_offsets" in store.adopted
        with store.consumer("g", "orders", enable_auto_commit=False) as consumer:
            assert consumer.committed("orders", 0) == 3 and consumer.committed("orders", 2) is None


def malformed_record_batch(base_offset: int) -> bytes:
    """A batch whose CRC is right but whose one record claims more bytes than the batch has."""
    out = bytearray(batch([(commit_key("g", "orders", 0), commit_value(9))], base_offset))
    out[61] = 0x7E  # the record's length varint: 63 bytes
    out[17:21] = struct.pack(">I", calc_crc32c(bytes(out[21:])))
    return bytes(out)


@pytest.mark.parametrize("case, records, message", [
    ("value version 2", [(commit_key("g", "orders", 0), commit_value(5, version=2))], "version 2 is not supported"),
    ("malformed record", None, "at position 109: batch is truncated"),
])
def test_incompatible_single_partition_offsets_are_skipped_and_set_aside(tmp_path, case, records, message):
    root = make_kafka_log_dir(tmp_path / "kafka", offsets_partitions=0)
    ok = [(commit_key("g", "orders", 0), commit_value(1))]
    if case == "malformed record":
        segment = offsets_segment(ok) + malformed_record_batch(1)
    else:
        segment = offsets_segment(ok, records)
    _partition(root, "__consumer_offsets-0", segment=segment)
    found = scan(str(root), quiet=True)
    assert "__consumer_offsets" not in found.topics
    assert message in dict((s.name, s.reason) for s in found.skipped)["__consumer_offsets-0"]
    assert StoreView(root).topics(internal=True) == ["orders"]
    with LogStore(root, maintenance=False) as store:
        with store.consumer("g", "orders") as consumer:
            assert consumer.committed("orders", 0) is None
            consumer.commit({("orders", 0): 4})
    assert (root / OFFSETS_ASIDE_DIR / "__consumer_offsets-0" / f"{SEGMENT}.log").read_bytes() == segment


def test_a_running_kafka_broker_keeps_logstore_out(tmp_path):
    root = make_kafka_log_dir(tmp_path / "kafka", offsets_partitions=0)
    # A Java FileLock is a POSIX record lock: hold one from another process, as a broker does.
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(root / '.lock')!r}, os.O_RDWR)
        fcntl.lockf(fd, fcntl.LOCK_EX)
        print("locked", flush=True)
        sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LogLockedError, match="in use by a Kafka broker"):
            LogStore(root, maintenance=False)
        assert not (root / ".topics").exists()
        assert StoreView(root).topics() == ["orders"]  # reading is still fine
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    with LogStore(root, maintenance=False) as store:
        assert store.adopted == ("orders",)


def test_adoption_interrupted_by_a_crash_is_redone(tmp_path):
    root = make_kafka_log_dir(tmp_path / "kafka", offsets_partitions=3)
    # The state a crash leaves: a half-written staging directory, and one of Kafka's offsets
    # partitions already moved aside.
    (root / ".topics.adopt").mkdir()
    (root / ".topics.adopt" / "orders").write_text("partitions=1\n")
    (root / OFFSETS_ASIDE_DIR).mkdir()
    os.rename(root / "__consumer_offsets-1", root / OFFSETS_ASIDE_DIR / "__consumer_offsets-1")
    os.rename(root / "__consumer_offsets-2", root / OFFSETS_ASIDE_DIR / "__consumer_offsets-2")
    # What is left in the root (partition 0 alone) would pass as compatible: it must follow the others.
    assert "__consumer_offsets" in scan(str(root), quiet=True).topics
    with LogStore(root, maintenance=False) as store:
        assert store.adopted == ("orders",)
        assert store.describe("orders").partitions == 3
    assert sorted(os.listdir(root / OFFSETS_ASIDE_DIR)) == [f"__consumer_offsets-{p}" for p in range(3)]
    assert not (root / ".topics.adopt").exists()
    assert sorted(os.listdir(root / ".topics")) == ["orders"]


def test_an_empty_directory_is_a_new_store_not_an_adoption(tmp_path):
    with LogStore(tmp_path / "new", maintenance=False) as store:
        assert store.adopted == () and store.topics() == []
    assert (tmp_path / "new" / ".topics").is_dir()


def test_kafka_meta_properties_is_kept(tmp_path):
    root = make_kafka_log_dir(tmp_path / "kafka", offsets_partitions=0)
    meta = (root / "meta.properties").read_bytes()
    with LogStore(root, maintenance=False):
        pass
    assert (root / "meta.properties").read_bytes() == meta


def test_adopted_offsets_topic_settings_match_what_the_store_gives_it(tmp_path):
    from logstore.groups.offsets import OFFSETS_TOPIC_CONFIG

    with LogStore(tmp_path / "s", maintenance=False) as store:
        assert store._overrides(OFFSETS_TOPIC_CONFIG) == dict(OFFSETS_TOPIC_OVERRIDES)


def test_not_a_store_nor_a_kafka_log_dir_is_named(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("x")
    with pytest.raises(Exception, match="nor a Kafka log directory"):
        StoreView(tmp_path / "plain")
    with pytest.raises(Exception, match="no such directory"):
        StoreView(tmp_path / "missing")
    assert not (tmp_path / "plain" / ".topics").exists()



def test_recover_on_a_kafka_log_dir_recovers_its_partitions_not_the_root(tmp_path, capsys):
    root = make_kafka_log_dir(tmp_path / "kafka", offsets_partitions=0)
    torn = root / "orders-2" / f"{SEGMENT}.log"
    torn.write_bytes(torn.read_bytes() + b"\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x30torn")
    assert main(["recover", str(root), "--json", "--quiet"]) == 0
    reports = {r["partition"]: r for r in json.loads(capsys.readouterr().out)}
    assert sorted(reports) == ["orders-0", "orders-1", "orders-2"]
    assert reports["orders-2"]["bytes_truncated"] == 16 and reports["orders-0"]["bytes_truncated"] == 0
    assert not any(name.endswith(".log") for name in os.listdir(root))  # the root is no partition
    assert torn.read_bytes() == FIXTURE.read_bytes()


def test_the_command_line_warns_about_what_it_does_not_adopt(tmp_path):
    root = make_kafka_log_dir(tmp_path / "kafka")
    r = subprocess.run([sys.executable, "-m", "logstore", "topics", "list", str(root), "--internal"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "orders\n"
    warnings = r.stderr.splitlines()
    assert len(warnings) == 2 and all(w.startswith("logstore topics: warning: ") for w in warnings)
    assert "not adopting __consumer_offsets (50 partition directories)" in warnings[0]
    assert "partition(s) 1 (held by another broker?)" in warnings[1]


# ---------------------------------------------------------------------- producer state snapshots
def idempotent_batch(values: list[bytes], base_offset: int, producer_id: int, epoch: int, sequence: int) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, producer_id, epoch, sequence, 1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1726045960000 + i, key=None, value=value, headers=[])
    out = bytearray(builder.build())
    out[0:8] = base_offset.to_bytes(8, "big")
    return bytes(out)


def kafka_snapshot(entries: list[tuple[int, int, int, int, int, int]]) -> bytes:
    """Kafka's ProducerSnapshot v1 (struct and kafka-python's CRC32C): version, crc, then the
    array of (producer id, epoch, last sequence, last offset, offset delta, timestamp,
    coordinator epoch -1, current transaction first offset -1)."""
    body = struct.pack(">i", len(entries)) + b"".join(struct.pack(">qhiqiqiq", *e, -1, -1) for e in entries)
    return struct.pack(">hI", 1, calc_crc32c(body)) + body


def test_an_adopted_partition_reads_kafkas_producer_snapshot(tmp_path):
    root = make_kafka_log_dir(tmp_path / "kafka", offsets_partitions=0)
    batches = [idempotent_batch([b"a", b"b"], 0, 4000, 1, 0), idempotent_batch([b"c", b"d", b"e"], 2, 4000, 1, 2)]
    part = _partition(root, "payments-0", segment=b"".join(batches))  # (with Kafka's empty snapshot at 0)
    # Kafka's clean shutdown wrote the state at the log end (5): producer 4000's last batch is
    # offsets 2..4, sequences 2..4. (Kafka writes the batch's largest timestamp; a distinct one
    # here shows that the snapshot, not a replay of the log, is what the state came from.)
    (part / f"{5:020d}.snapshot").write_bytes(kafka_snapshot([(4000, 1, 4, 4, 2, 1726045999999)]))
    with LogStore(root, maintenance=False) as store:
        log = store.partition("payments", 0)
        assert log.log_end_offset == 5
        entry = log.active_producers()[4000]
        assert (entry.epoch, entry.last_sequence, entry.last_timestamp) == (1, 4, 1726045999999)
        assert log.append_idempotent(batches[1]) == (2, 4, True)
        nxt = idempotent_batch([b"f"], 0, 4000, 1, 5)
        assert log.append_idempotent(nxt) == (5, 5, False)
    assert sorted(p.name for p in part.iterdir() if p.suffix == ".snapshot") == [
        f"{0:020d}.snapshot", f"{5:020d}.snapshot", f"{6:020d}.snapshot"]
    # Reading the directory (views, tools) never touches the snapshots.
    before = tree(root)
    assert main(["verify", str(root), "--quiet"]) == 0
    assert tree(root) == before
