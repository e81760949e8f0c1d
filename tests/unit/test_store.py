"""LogStore: topic naming, topic metadata, deletion, maintenance, sharing and meta.properties.

flock locks belong to an open file description, so two LogStores on one root in one process
contend exactly as two processes would; the sharing tests rely on that.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

import logstore
from logstore import (
    InvalidConfigError,
    InvalidTopicError,
    LogClosedError,
    LogLockedError,
    LogstoreError,
    LogStore,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)

HOUR_MS = 3_600_000


def now_ms() -> int:
    return int(time.time() * 1000)


def snapshot(root) -> set[str]:
    """Every path (directories and files) under ``root``, relative to it."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in dirnames + filenames:
            out.add(os.path.normpath(os.path.join(rel, name)))
    return out


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "store")


@pytest.fixture
def store(root):
    s = LogStore(root, maintenance=False)
    yield s
    s.close()


# ---------------------------------------------------------------------- topic names

BAD_NAMES = [
    pytest.param("../x", id="dotdot-slash"),
    pytest.param("../../etc/passwd", id="deep-traversal"),
    pytest.param("a/b", id="slash"),
    pytest.param("/abs", id="absolute"),
    pytest.param("a\\b", id="backslash"),
    pytest.param("..", id="dotdot"),
    pytest.param(".", id="dot"),
    pytest.param("x\x00", id="nul"),
    pytest.param("a b", id="space"),
    pytest.param("tab\t", id="tab"),
    pytest.param("é", id="non-ascii"),
    pytest.param("x:y", id="colon"),
    pytest.param("a" * 250, id="250-chars"),
    pytest.param("", id="empty"),
    pytest.param(None, id="None"),
    pytest.param(123, id="int"),
    pytest.param(b"topic", id="bytes"),
    pytest.param("a\n", id="trailing-newline", marks=pytest.mark.regression),
]

OPERATIONS = {
    "create_topic": lambda s, name: s.create_topic(name),
    "delete_topic": lambda s, name: s.delete_topic(name),
    "partition": lambda s, name: s.partition(name, 0),
    "describe": lambda s, name: s.describe(name),
    "partitions_for": lambda s, name: s.partitions_for(name),
}


@pytest.mark.parametrize("op", sorted(OPERATIONS))
@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_topic_names_are_rejected_and_nothing_is_written(store, root, name, op):
    store.create_topic("existing", 2)
    before = snapshot(root)
    with pytest.raises(InvalidTopicError):
        OPERATIONS[op](store, name)
    assert snapshot(root) == before
    assert store.topics() == ["existing"]
    # Nothing outside the root either: the parent holds only the store.
    assert os.listdir(os.path.dirname(root)) == [os.path.basename(root)]


def test_invalid_topic_error_is_a_value_error(store):
    with pytest.raises(ValueError):
        store.create_topic("a/b")


@pytest.mark.parametrize("name", ["a" * 200, "a.b_c-D9", "...", "-", "_x", "x__y", "UPPER.lower"])
def test_legal_edge_case_names_are_accepted(store, root, name):
    store.create_topic(name)
    assert store.topics() == [name]
    assert os.path.isdir(os.path.join(root, f"{name}-0"))
    assert store.describe(name).partitions == 1
    store.delete_topic(name)
    assert store.topics() == []
    assert not os.path.exists(os.path.join(root, f"{name}-0"))


@pytest.mark.regression
@pytest.mark.parametrize("length", [241, 249])
def test_longest_legal_names_can_be_created(store, root, length):
    name = "a" * length
    store.create_topic(name)
    assert store.topics() == [name]
    assert os.path.isdir(os.path.join(root, f"{name}-0"))


@pytest.mark.regression
@pytest.mark.parametrize("length", [214, 240])
def test_long_names_can_be_deleted(root, length):
    name = "b" * length
    with LogStore(root, maintenance=False) as s:
        s.create_topic(name)
        s.partition(name, 0).append(b"x")
        try:
            s.delete_topic(name)
        except OSError:
            pass
        assert s.topics() == []
    with LogStore(root, maintenance=False):
        assert not any(n.startswith("bbb") for n in os.listdir(root))


@pytest.mark.parametrize("name", ["__consumer_offsets", "__x", "__"])
def test_reserved_names_rejected_unless_internal(store, root, name):
    before = snapshot(root)
    with pytest.raises(InvalidTopicError):
        store.create_topic(name)
    assert snapshot(root) == before
    store.create_topic(name, 2, internal=True)
    assert store.topics() == []
    assert store.topics(internal=True) == [name]
    description = store.describe(name)
    assert description.internal and description.partitions == 2
    store.create_topic("_single_underscore")  # one underscore is an ordinary name
    assert store.topics() == ["_single_underscore"]


# ---------------------------------------------------------------------- topics and config

def test_create_topic_creates_partition_directories_and_properties(store, root):
    store.create_topic("events", 3)
    assert store.topics() == ["events"]
    for p in range(3):
        assert os.path.isdir(os.path.join(root, f"events-{p}"))
        log = store.partition("events", p)
        assert (log.topic, log.partition) == ("events", p)
    assert not os.path.exists(os.path.join(root, "events-3"))
    props = open(os.path.join(root, ".topics", "events")).read()
    assert "partitions=3" in props.splitlines()
    assert store.partitions_for("events") == 3
    description = store.describe("events")
    assert (description.name, description.partitions, description.overrides) == ("events", 3, {})
    assert description.config == store.defaults
    assert description.internal is False


def test_topics_are_sorted(store):
    for name in ["zeta", "alpha", "Mid", "beta.2"]:
        store.create_topic(name)
    assert store.topics() == sorted(["zeta", "alpha", "Mid", "beta.2"])


def test_partition_returns_the_same_log_until_closed(store):
    store.create_topic("t", 2)
    log = store.partition("t", 1)
    assert store.partition("t", 1) is log
    assert store.partition("t", 0) is not log


def test_topic_config_round_trips_through_reopen(root):
    with LogStore(root, maintenance=False, segment_bytes=1 << 20, retention_bytes=-1) as s:
        s.create_topic("cfg", 2, retention_ms=HOUR_MS, cleanup_policy="compact", segment_bytes=65536,
                       **{"max.message.bytes": "5000", "flush.messages": 10})
        s.create_topic("plain")
        first = s.describe("cfg")
        assert first.config.segment_bytes == 65536
    expected_overrides = {
        "retention.ms": str(HOUR_MS),
        "cleanup.policy": "compact",
        "segment.bytes": "65536",
        "max.message.bytes": "5000",
        "flush.messages": "10",
    }
    with LogStore(root, maintenance=False, segment_bytes=1 << 22, segment_index_bytes=4096,
                  retention_bytes=10**9, retention_ms=1234) as s:
        assert s.topics() == ["cfg", "plain"]
        d = s.describe("cfg")
        assert d.partitions == 2
        assert d.overrides == expected_overrides
        cfg = d.config
        # the topic's own settings win ...
        assert cfg.retention_ms == HOUR_MS
        assert cfg.cleanup_policy == "compact" and cfg.compacted and not cfg.deletes
        assert cfg.segment_bytes == 65536
        assert cfg.max_message_bytes == 5000
        assert cfg.flush_messages == 10
        # ... and the new store defaults fill in the rest
        assert cfg.segment_index_bytes == 4096
        assert cfg.retention_bytes == 10**9
        for p in range(2):
            assert s.partition("cfg", p).config == cfg
        # a topic without overrides follows the store's defaults entirely
        plain = s.describe("plain")
        assert plain.overrides == {}
        assert plain.config == s.defaults
        assert plain.config.retention_ms == 1234 and plain.config.segment_bytes == 1 << 22
        assert s.partition("plain", 0).config == s.defaults


def test_dotted_and_snake_case_overrides_are_equivalent(store):
    store.create_topic("snake", retention_ms=5000, compression_type="gzip", segment_ms=100_000, flush_ms=None)
    store.create_topic("dotted", **{"retention.ms": 5000, "compression.type": "gzip", "segment.ms": "100000",
                                    "flush.ms": str(2**63 - 1)})
    a, b = store.describe("snake"), store.describe("dotted")
    assert a.overrides == b.overrides == {"retention.ms": "5000", "compression.type": "gzip",
                                          "segment.ms": "100000", "flush.ms": str(2**63 - 1)}
    assert a.config == b.config
    assert a.config.segment_ms == 100_000 and a.config.compression_type == "gzip"
    assert a.config.flush_ms is None


def test_topic_exists_error_and_exist_ok_keeps_old_settings(store, root):
    store.create_topic("t", 2, retention_ms=HOUR_MS)
    before = snapshot(root)
    with pytest.raises(TopicExistsError):
        store.create_topic("t", 2, retention_ms=HOUR_MS)
    with pytest.raises(TopicExistsError):
        store.create_topic("t", 5)
    store.create_topic("t", 5, exist_ok=True, retention_ms=1, segment_bytes=1 << 16)
    assert snapshot(root) == before
    d = store.describe("t")
    assert d.partitions == 2
    assert d.overrides == {"retention.ms": str(HOUR_MS)}
    assert d.config.segment_bytes == store.defaults.segment_bytes


def test_topic_exists_across_reopen(root):
    with LogStore(root, maintenance=False) as s:
        s.create_topic("t")
    with LogStore(root, maintenance=False) as s:
        with pytest.raises(TopicExistsError):
            s.create_topic("t")


def test_unknown_topic(store):
    for call in (lambda: store.describe("nope"), lambda: store.partition("nope", 0),
                 lambda: store.delete_topic("nope"), lambda: store.partitions_for("nope")):
        with pytest.raises(UnknownTopicOrPartitionError) as info:
            call()
        assert "nope" in str(info.value)
        assert isinstance(info.value, KeyError)


@pytest.mark.parametrize("partition", [2, 3, -1, 100, True, False, 1.0, "0", None])
def test_unknown_partition_of_one_partition_topic(root, partition):
    """With no Log of the topic open yet (a fresh store), every bad partition is refused."""
    with LogStore(root, maintenance=False) as s:
        s.create_topic("t", 2)
    with LogStore(root, maintenance=False) as s:
        before = snapshot(root)
        with pytest.raises(UnknownTopicOrPartitionError):
            s.partition("t", partition)
        assert snapshot(root) == before


@pytest.mark.regression
@pytest.mark.parametrize("partition", [True, 1.0])
def test_bool_partition_refused_even_when_partition_one_is_open(store, partition):
    store.create_topic("t", 2)  # create_topic opens every partition
    assert store.partition("t", 1) is not None
    with pytest.raises(UnknownTopicOrPartitionError):
        store.partition("t", partition)


BAD_CONFIGS = [
    pytest.param(dict(retention_ms=-5), id="retention_ms<-1"),
    pytest.param(dict(segment_bytes=1), id="segment_bytes-too-small"),
    pytest.param(dict(segment_bytes="big"), id="segment_bytes-str"),
    pytest.param(dict(cleanup_policy="bogus"), id="cleanup_policy"),
    pytest.param(dict(compression_type="brotli"), id="compression_type"),
    pytest.param(dict(preallocate="yes"), id="preallocate-str"),
    pytest.param(dict(min_cleanable_dirty_ratio=1.5), id="dirty-ratio"),
    pytest.param(dict(no_such_setting=1), id="unknown-field"),
    pytest.param({"retention.ms": "abc"}, id="dotted-unparsable"),
    pytest.param({"no.such.config": 1}, id="dotted-unknown"),
    pytest.param({"preallocate": "maybe"}, id="dotted-bool"),
]


@pytest.mark.parametrize("config", BAD_CONFIGS)
def test_bad_config_writes_nothing(store, root, config):
    before = snapshot(root)
    with pytest.raises(InvalidConfigError):
        store.create_topic("t", 2, **config)
    assert snapshot(root) == before
    assert store.topics() == []


@pytest.mark.parametrize("partitions", [0, -1, True, 1.5, "2", None, 1_000_001])
def test_bad_partition_count_writes_nothing(store, root, partitions):
    before = snapshot(root)
    with pytest.raises(InvalidConfigError):
        store.create_topic("t", partitions)
    assert snapshot(root) == before
    assert store.topics() == []


def test_bad_store_defaults_and_intervals(root):
    with pytest.raises(InvalidConfigError):
        LogStore(root, maintenance=False, retention_ms=-7)
    with pytest.raises(InvalidConfigError):
        LogStore(root, maintenance=False, retention_check_interval_ms=0)
    with pytest.raises(InvalidConfigError):
        LogStore(root, maintenance=False, cleaner_backoff_ms=True)


def test_closed_store_refuses_use(root):
    s = LogStore(root, maintenance=False)
    s.create_topic("t")
    log = s.partition("t", 0)
    s.close()
    assert s.closed and log.closed
    s.close()  # idempotent
    with pytest.raises(LogClosedError):
        s.create_topic("u")
    with pytest.raises(LogClosedError):
        s.topics()
    with pytest.raises(LogClosedError):
        s.partition("t", 0)
    with pytest.raises(LogClosedError):
        s.run_maintenance()
    assert "closed" in repr(s)


# ---------------------------------------------------------------------- deletion

def _checkpoint_topics(root) -> set[str]:
    topics = set()
    for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint"):
        path = os.path.join(root, name)
        if os.path.exists(path):
            for line in open(path).read().splitlines()[2:]:
                topics.add(line.split()[0])
    return topics


def test_delete_topic_removes_directories_and_properties(store, root):
    store.create_topic("gone", 3)
    store.create_topic("kept", 1)
    for p in range(3):
        store.partition("gone", p).append(b"x%d" % p)
        store.partition("gone", p).roll()  # writes checkpoints that mention the topic
    store.partition("kept", 0).append(b"stay")
    store.delete_topic("gone")
    assert store.topics() == ["kept"]
    assert not os.path.exists(os.path.join(root, ".topics", "gone"))
    leftovers = [n for n in os.listdir(root) if n.startswith("gone")]
    assert leftovers == []
    assert "gone" not in _checkpoint_topics(root)
    with pytest.raises(UnknownTopicOrPartitionError):
        store.describe("gone")
    with pytest.raises(UnknownTopicOrPartitionError):
        store.partition("gone", 0)
    assert [r.value for r in store.partition("kept", 0).read(0)] == [b"stay"]
    # the name is free again, and the new topic starts empty
    store.create_topic("gone", 1, retention_ms=10_000)
    assert store.partition("gone", 0).log_end_offset == 0
    assert store.describe("gone").overrides == {"retention.ms": "10000"}


def test_delete_topic_closes_its_logs(store):
    store.create_topic("t", 2)
    logs = [store.partition("t", p) for p in range(2)]
    store.delete_topic("t")
    assert all(log.closed for log in logs)


def test_leftover_delete_directories_removed_on_open(root):
    with LogStore(root, maintenance=False) as s:
        s.create_topic("t", 1)
        s.partition("t", 0).append(b"keep me")
    doomed = os.path.join(root, "old-0.0123456789abcdef0123456789abcdef-delete")
    os.makedirs(os.path.join(doomed, "sub"))
    with open(os.path.join(doomed, "00000000000000000000.log"), "wb") as f:
        f.write(b"\0" * 100)
    not_a_dir = os.path.join(root, "file-delete")
    open(not_a_dir, "wb").close()
    with LogStore(root, maintenance=False) as s:
        assert not os.path.exists(doomed)
        assert os.path.exists(not_a_dir)  # only directories are leftovers of a deletion
        assert s.topics() == ["t"]
        assert [r.value for r in s.partition("t", 0).read(0)] == [b"keep me"]


def test_delete_topic_with_partition_open_elsewhere_raises_and_deletes_nothing(root):
    a = LogStore(root, maintenance=False)
    b = LogStore(root, maintenance=False)
    try:
        a.create_topic("t", 2)
        a.partition("t", 0).append(b"a0")
        assert b.partition("t", 1) is not None  # b holds partition 1 open
        before = snapshot(root)
        with pytest.raises(LogLockedError):
            a.delete_topic("t")
        assert a.topics() == b.topics() == ["t"]
        assert os.path.exists(os.path.join(root, ".topics", "t"))
        assert {n for n in os.listdir(root) if n.startswith("t-")} == {"t-0", "t-1"}
        # nothing removed (closing a's own logs may only add clean-shutdown markers)
        assert before - snapshot(root) == set()
        assert [r.value for r in a.partition("t", 0).read(0)] == [b"a0"]
        assert [r.value for r in b.partition("t", 0).read(0)] == [b"a0"]
        b.close()
        a.delete_topic("t")
        assert a.topics() == []
        assert not any(n.startswith("t-") for n in os.listdir(root))
    finally:
        a.close()
        b.close()


# ---------------------------------------------------------------------- maintenance

def _fill_expiring(log, old_ts: int, new_ts: int) -> None:
    for i in range(5):
        log.append(b"old-%d" % i, timestamp=old_ts)
    log.roll()
    for i in range(3):
        log.append(b"new-%d" % i, timestamp=new_ts)


def test_run_maintenance_enforces_retention(root):
    with LogStore(root, maintenance=False, file_delete_delay_ms=0, segment_bytes=1 << 16) as s:
        s.create_topic("short", retention_ms=60_000)
        s.create_topic("forever", retention_ms=-1)
        now = now_ms()
        short, forever = s.partition("short", 0), s.partition("forever", 0)
        _fill_expiring(short, now - HOUR_MS, now)
        _fill_expiring(forever, now - HOUR_MS, now)
        assert len(short.segments) == 2
        counts = s.run_maintenance(now_ms=now)
        assert counts == {"segments_deleted": 1, "flushes": 0, "logs_cleaned": 0}
        assert short.log_start_offset == 5
        assert [r.value for r in short.read(5)] == [b"new-0", b"new-1", b"new-2"]
        assert [seg.base_offset for seg in short.segments] == [5]
        files = os.listdir(short.path)
        assert not any(f.startswith("00000000000000000000.") for f in files), files
        assert forever.log_start_offset == 0 and len(forever.segments) == 2
        # idempotent: nothing more to do
        assert s.run_maintenance(now_ms=now)["segments_deleted"] == 0
        # later, the newer records expire too (the active segment rolls and goes)
        counts = s.run_maintenance(now_ms=now + HOUR_MS)
        assert counts["segments_deleted"] == 1
        assert short.log_start_offset == 8 == short.log_end_offset
        assert forever.log_start_offset == 0


def test_run_maintenance_flushes_due_logs(store):
    store.create_topic("f", flush_ms=0)
    store.create_topic("nf")
    f, nf = store.partition("f", 0), store.partition("nf", 0)
    for i in range(3):
        f.append(b"%d" % i)
        nf.append(b"%d" % i)
    assert f.recovery_point == 0
    counts = store.run_maintenance()
    assert counts["flushes"] == 1
    assert f.recovery_point == 3
    assert nf.recovery_point == 0
    assert store.run_maintenance()["flushes"] == 0  # nothing pending any more


def _maintenance_thread(root):
    name = f"logstore-maintenance[{os.path.abspath(root)}]"
    found = [t for t in threading.enumerate() if t.name == name]
    return found[0] if found else None


def test_scheduler_enforces_retention_and_close_stops_it(root):
    s = LogStore(root, file_delete_delay_ms=0, retention_check_interval_ms=100)
    try:
        thread = _maintenance_thread(root)
        assert thread is not None and thread.is_alive()
        s.create_topic("t", retention_ms=60_000)
        log = s.partition("t", 0)
        now = now_ms()
        _fill_expiring(log, now - HOUR_MS, now)
        assert wait_until(lambda: log.log_start_offset == 5, timeout=10)
        assert [r.value for r in log.read(5)] == [b"new-0", b"new-1", b"new-2"]
        assert wait_until(lambda: not any(f.startswith("00000000000000000000.") for f in os.listdir(log.path)))
    finally:
        s.close()
    assert not thread.is_alive()
    assert _maintenance_thread(root) is None


@pytest.mark.regression
def test_scheduler_honours_short_retention_interval(root):
    start = time.monotonic()
    s = LogStore(root, file_delete_delay_ms=0, retention_check_interval_ms=100)
    try:
        s.create_topic("t", retention_ms=60_000)
        log = s.partition("t", 0)
        now = now_ms()
        _fill_expiring(log, now - HOUR_MS, now)
        wait_until(lambda: log.log_start_offset == 5, timeout=3)
        elapsed = time.monotonic() - start
        assert log.log_start_offset == 5
        # 100 ms interval: a few intervals at most, well under the 1 s tick
        assert elapsed < 0.6, f"retention ran only after {elapsed:.2f} s"
    finally:
        s.close()


def test_scheduler_flushes_topics_with_flush_ms(root):
    with LogStore(root, retention_check_interval_ms=100) as s:
        s.create_topic("f", flush_ms=50)
        s.create_topic("nf")
        f, nf = s.partition("f", 0), s.partition("nf", 0)
        for i in range(3):
            f.append(b"%d" % i)
            nf.append(b"%d" % i)
        assert wait_until(lambda: f.recovery_point == 3, timeout=10)
        assert nf.recovery_point == 0  # no flush policy: left to the OS


def test_maintenance_false_starts_no_thread(root):
    with LogStore(root, maintenance=False):
        assert _maintenance_thread(root) is None


# ---------------------------------------------------------------------- sharing

def test_two_shared_stores_see_each_others_topics_and_appends(root):
    a = LogStore(root, maintenance=False)
    b = LogStore(root, maintenance=False)
    try:
        a.create_topic("t", 2)
        assert b.topics() == ["t"]
        assert b.describe("t").partitions == 2
        assert a.partition("t", 1).append(b"from-a") == 0
        assert [r.value for r in b.partition("t", 1).read(0)] == [b"from-a"]
        assert b.partition("t", 1).append(b"from-b") == 1
        assert [r.value for r in a.partition("t", 1).read(0)] == [b"from-a", b"from-b"]
        assert a.partition("t", 0).log_end_offset == b.partition("t", 0).log_end_offset == 0
    finally:
        a.close()
        b.close()
    with LogStore(root, maintenance=False) as c:
        assert [r.value for r in c.partition("t", 1).read(0)] == [b"from-a", b"from-b"]


def test_exclusive_store_conflicts_with_any_other_store(root):
    a = LogStore(root, maintenance=False)
    try:
        with pytest.raises(LogLockedError):
            LogStore(root, shared=False, maintenance=False)
    finally:
        a.close()
    ex = LogStore(root, shared=False, maintenance=False)
    try:
        ex.create_topic("t")
        ex.partition("t", 0).append(b"x")
        with pytest.raises(LogLockedError):
            LogStore(root, maintenance=False)
        with pytest.raises(LogLockedError):
            LogStore(root, shared=False, maintenance=False)
    finally:
        ex.close()
    with LogStore(root, maintenance=False) as again:
        assert [r.value for r in again.partition("t", 0).read(0)] == [b"x"]


# ---------------------------------------------------------------------- meta.properties

def _meta(root) -> dict[str, str]:
    props = {}
    for line in open(os.path.join(root, "meta.properties")).read().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            props[k] = v
    return props


def test_meta_properties_written_and_kept(root):
    with LogStore(root, maintenance=False):
        pass
    meta = _meta(root)
    assert meta["version"] == "1"
    assert len(meta["directory.id"]) == 36
    with LogStore(root, maintenance=False):
        pass
    assert _meta(root) == meta  # reopening does not rewrite the id


@pytest.mark.parametrize("content", [
    "version=2\ndirectory.id=x\n",
    "version=99\n",
    "version=abc\n",
    "version=-1\n",
    "directory.id=x\n",
    "this line has no equals sign\n",
])
def test_unsupported_meta_version_raises(root, content):
    os.makedirs(root)
    with open(os.path.join(root, "meta.properties"), "w") as f:
        f.write(content)
    with pytest.raises(LogstoreError) as info:
        LogStore(root, maintenance=False)
    assert "meta.properties" in str(info.value)
    assert _maintenance_thread(root) is None
    # the failed open released its lock: an exclusive open works once the file is fixed
    with open(os.path.join(root, "meta.properties"), "w") as f:
        f.write("version=1\n")
    with LogStore(root, shared=False, maintenance=False) as s:
        assert s.topics() == []


def test_public_exports():
    assert logstore.LogStore is LogStore
    assert logstore.TopicDescription is not None


def test_closing_the_store_closes_its_producers_and_consumers_first(tmp_path):
    store = LogStore(str(tmp_path / "s"), maintenance=False)
    store.create_topic("t", 1)
    producer = store.producer(linger_ms=60_000)
    future = producer.send("t", b"pending")
    consumer = store.consumer("g", "t")
    assert consumer.assignment() == {("t", 0)}  # has a position (0) to commit
    store.close()
    assert future.result(timeout=5).offset == 0  # written by the producer's close
    assert consumer.closed
    with LogStore(str(tmp_path / "s"), maintenance=False) as again:
        assert [r.value for r in again.partition("t", 0).read(0)] == [b"pending"]
        c = again.consumer("g", "t")
        assert c.committed("t", 0) == 0  # the consumer committed its position at close


# ---------------------------------------------------------------------- adopting partition directories
def _partition_dirs(root, *names):
    from logstore import Log

    for name in names:
        with Log.open(os.path.join(root, name)) as log:
            log.append(name.encode())


def test_a_directory_of_partitions_without_topic_files_is_adopted(root):
    _partition_dirs(root, "t-0", "t-3", "u-0")
    with LogStore(root, maintenance=False) as store:
        assert store.adopted == ("t", "u")
        assert store.topics() == ["t", "u"]
        assert store.partitions_for("t") == 4
        assert store.describe("t").overrides == {}
        assert [r.value for r in store.partition("t", 3).read(0)] == [b"t-3"]
        assert store.partition("t", 1).log_end_offset == 0
    with open(os.path.join(root, ".topics", "t")) as f:
        assert f.read().startswith("partitions=4\ntopic.id=")  # a new id: the directories have none


def test_orphan_partition_directories_in_a_store_are_not_adopted(root):
    # A store's .topics/ is the truth: a directory without a topic file there is what an
    # interrupted delete_topic leaves, and must not bring the topic back.
    with LogStore(root, maintenance=False) as store:
        store.create_topic("kept")
    _partition_dirs(root, "ghost-0")
    with LogStore(root, maintenance=False) as store:
        assert store.adopted == ()
        assert store.topics() == ["kept"]


def test_stores_opened_at_once_adopt_once(root):
    _partition_dirs(root, "t-0", "t-1")
    adopted, errors = [], []

    def open_store():
        try:
            with LogStore(root, maintenance=False) as s:
                adopted.append(s.adopted)
                assert s.partitions_for("t") == 2
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(adopted) == [(), (), (), ("t",)]


# ---------------------------------------------------------------------------- growing a topic, altering its config
def test_create_partitions_grows_a_topic_with_empty_partitions_and_keeps_the_others(tmp_path):
    with LogStore(tmp_path, maintenance=False) as store:
        store.create_topic("grow", 2)
        store.partition("grow", 1).append(b"kept")
        store.create_partitions("grow", 4)
        assert store.partitions_for("grow") == 4
        assert [store.partition("grow", p).log_end_offset for p in range(4)] == [0, 1, 0, 0]
        store.partition("grow", 3).append(b"new")
    with LogStore(tmp_path, maintenance=False) as store:
        assert store.partitions_for("grow") == 4
        assert [r.value for r in store.partition("grow", 3).iter()] == [b"new"]
        assert [r.value for r in store.partition("grow", 1).iter()] == [b"kept"]


def test_create_partitions_refuses_a_count_that_does_not_grow_and_validate_only_writes_nothing(tmp_path):
    with LogStore(tmp_path, maintenance=False) as store:
        store.create_topic("fixed", 3)
        before = snapshot(tmp_path)
        for count in (2, 3):
            with pytest.raises(logstore.InvalidPartitionsError, match="can only grow"):
                store.create_partitions("fixed", count)
        with pytest.raises(UnknownTopicOrPartitionError):
            store.create_partitions("missing", 3)
        with pytest.raises(TypeError):
            store.create_partitions("fixed", "5")  # type: ignore[arg-type]
        store.create_partitions("fixed", 5, validate_only=True)
        assert store.partitions_for("fixed") == 3 and snapshot(tmp_path) == before


def test_another_store_object_sees_new_partitions_when_it_asks_for_one_and_after_the_max_age(tmp_path, monkeypatch):
    with LogStore(tmp_path, maintenance=False) as first, LogStore(tmp_path, maintenance=False) as second:
        first.create_topic("shared", 1)
        assert second.partitions_for("shared") == 1
        first.create_partitions("shared", 3)
        second.partition("shared", 2).append(b"x")  # a partition past the count it knew: it looks again
        assert second.partitions_for("shared") == 3
        first.create_partitions("shared", 5)
        monkeypatch.setattr("logstore.store.store.TOPIC_MAX_AGE_S", 0.0)
        assert second.partitions_for("shared") == 5


def test_alter_topic_config_applies_to_open_logs_at_once_and_persists(tmp_path):
    with LogStore(tmp_path, maintenance=False) as store:
        store.create_topic("tuned", 2, retention_ms=HOUR_MS)
        logs = [store.partition("tuned", p) for p in range(2)]
        stored = store.alter_topic_config("tuned", lambda current: {**current, "max.message.bytes": "300",
                                                                    "preallocate": True})
        assert stored == {"retention.ms": str(HOUR_MS), "max.message.bytes": "300", "preallocate": "true"}
        assert all(log.config.max_message_bytes == 300 and log.config.preallocate for log in logs)
        with pytest.raises(logstore.RecordTooLargeError):
            logs[0].append(b"x" * 400)
        assert logs[0].append(b"x" * 100) == 0
        store.alter_topic_config("tuned", lambda current: {})  # AlterConfigs' whole set: nothing
        assert logs[1].config == store.defaults and store.describe("tuned").overrides == {}
        logs[1].append(b"y" * 5000)
    with LogStore(tmp_path, maintenance=False, retention_ms=5) as store:
        assert store.describe("tuned").overrides == {}
        assert store.partition("tuned", 0).config.retention_ms == 5  # the store's default again


def test_alter_topic_config_refuses_a_bad_value_and_writes_nothing(tmp_path):
    with LogStore(tmp_path, maintenance=False) as store:
        store.create_topic("strict", 1, segment_ms=HOUR_MS)
        before = snapshot(tmp_path)
        with pytest.raises(InvalidConfigError):
            store.alter_topic_config("strict", lambda current: {"segment.bytes": "10"})
        with pytest.raises(InvalidConfigError):
            store.alter_topic_config("strict", lambda current: {"no.such.config": "1"})
        with pytest.raises(UnknownTopicOrPartitionError):
            store.alter_topic_config("missing", lambda current: {})
        store.alter_topic_config("strict", lambda current: {"segment.ms": "5"}, validate_only=True)
        assert store.describe("strict").overrides == {"segment.ms": str(HOUR_MS)} and snapshot(tmp_path) == before


def test_a_config_altered_by_another_store_object_reaches_its_open_logs_at_maintenance(tmp_path, monkeypatch):
    with LogStore(tmp_path, maintenance=False) as first, LogStore(tmp_path, maintenance=False) as second:
        first.create_topic("policy", 1)
        log = second.partition("policy", 0)
        first.alter_topic_config("policy", lambda current: {"cleanup.policy": "compact", "retention.ms": "1000"})
        monkeypatch.setattr("logstore.store.store.TOPIC_MAX_AGE_S", 0.0)
        second.run_maintenance()
        assert (log.config.cleanup_policy, log.config.retention_ms) == ("compact", 1000)
        with pytest.raises(logstore.InvalidRecordError):  # a compacted log needs keys, at once
            log.append(b"no key")


def test_dynamic_defaults_apply_to_topics_without_their_own_setting_in_every_store_object(tmp_path, monkeypatch):
    with LogStore(tmp_path, maintenance=False, retention_ms=HOUR_MS) as first, \
            LogStore(tmp_path, maintenance=False, retention_ms=HOUR_MS) as second:
        first.create_topic("plain", 1)
        first.create_topic("own", 1, retention_ms=5)
        log, own = first.partition("plain", 0), first.partition("own", 0)
        other = second.partition("plain", 0)
        assert first.alter_defaults(lambda current: {"retention.ms": 2 * HOUR_MS}) == {"retention.ms": str(2 * HOUR_MS)}
        assert (log.config.retention_ms, own.config.retention_ms) == (2 * HOUR_MS, 5)
        assert first.static_defaults.retention_ms == HOUR_MS
        monkeypatch.setattr("logstore.store.store.TOPIC_MAX_AGE_S", 0.0)
        second.run_maintenance()
        assert other.config.retention_ms == 2 * HOUR_MS and second.dynamic_defaults == {"retention.ms": str(2 * HOUR_MS)}
        before = snapshot(tmp_path)
        with pytest.raises(InvalidConfigError):
            first.alter_defaults(lambda current: {"segment.bytes": "3"})
        first.alter_defaults(lambda current: {}, validate_only=True)
        assert snapshot(tmp_path) == before and log.config.retention_ms == 2 * HOUR_MS
    with LogStore(tmp_path, maintenance=False, retention_ms=HOUR_MS) as store:
        assert store.partition("plain", 0).config.retention_ms == 2 * HOUR_MS  # durable; over the static default
        store.alter_defaults(lambda current: {})
        assert store.partition("plain", 0).config.retention_ms == HOUR_MS
        assert not os.path.exists(os.path.join(tmp_path, ".topic-defaults"))
