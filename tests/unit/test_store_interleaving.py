"""Two LogStore objects (as two processes would) on one root: growth, config changes,
deletion and re-creation interleaved, each store's view checked against the files.

The regression tests reproduce the findings of the store review of issue 29: a topic file
rewritten onto the inode the cache knew, a deletion counting stale partitions, a crash inside
a deletion, a partition opened with a deleted topic's id, and the store's lock held while a
log's lock is awaited.
"""

from __future__ import annotations

import os
import random
import threading

import pytest

from logstore import InvalidPartitionsError, LogStore
from logstore import _fileio
from logstore.store import store as store_module
from logstore.store.layout import read_topic_entry
from logstore.store.topicids import read_partition_metadata


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "store")


@pytest.fixture
def pair(root):
    a = LogStore(root, maintenance=False)
    b = LogStore(root, maintenance=False)
    yield a, b
    b.close()
    a.close()


def partition_dirs(root: str, topic: str) -> list[str]:
    return sorted(name for name in os.listdir(root) if name.rsplit("-", 1)[0] == topic
                  and name.rsplit("-", 1)[-1].isdigit())


@pytest.fixture
def same_inode(monkeypatch):
    """Every file seems to keep its (device, inode) when replaced, as ext4 does when it hands a
    freed inode to the next replacement."""
    monkeypatch.setattr(_fileio.ops, "path_identity", lambda path: (0, 0) if os.path.exists(path) else None)
    monkeypatch.setattr(_fileio.ops, "path_stamp",
                        lambda path: (0, 0, 0, 0) if os.path.exists(path) else None, raising=False)


@pytest.mark.regression
def test_a_topic_file_rewritten_onto_the_cached_inode_is_seen(pair, root, same_inode):
    a, b = pair
    a.create_topic("t", partitions=1)
    log = a.partition("t", 0)
    b.alter_topic_config("t", lambda current: {"retention.ms": "1000"})
    b.alter_topic_config("t", lambda current: {"retention.ms": "2000"})
    assert a._topic("t", fresh=True) == (1, {"retention.ms": "2000"})
    assert log.config.retention_ms == 2000


@pytest.mark.regression
def test_growing_from_a_stale_count_is_refused_and_keeps_the_file(pair, root, same_inode):
    a, b = pair
    a.create_topic("t", partitions=1, retention_ms=5000)
    assert a.partitions_for("t") == 1
    b.alter_topic_config("t", lambda current: {"retention.ms": "5000", "cleanup.policy": "compact"})
    b.create_partitions("t", 3)
    b.partition("t", 2).append(b"precious", key=b"k")
    with pytest.raises(InvalidPartitionsError):
        a.create_partitions("t", 2)
    entry = read_topic_entry(os.path.join(root, ".topics", "t"))
    assert entry.partitions == 3
    assert entry.overrides == {"retention.ms": "5000", "cleanup.policy": "compact"}
    assert [r.value for r in a.partition("t", 2).read(0)] == [b"precious"]


@pytest.mark.regression
def test_the_defaults_file_rewritten_onto_the_cached_inode_is_seen(pair, same_inode):
    a, b = pair
    a.create_topic("t", partitions=1)
    log = a.partition("t", 0)
    b.alter_defaults(lambda current: {"retention.ms": "1000"})
    a._read_dynamic_defaults(force=True)
    assert log.config.retention_ms == 1000
    b.alter_defaults(lambda current: {"retention.ms": "2000"})
    a._read_dynamic_defaults(force=True)
    assert log.config.retention_ms == 2000


@pytest.mark.regression
def test_delete_topic_removes_the_partitions_another_store_grew(root):
    a = LogStore(root, maintenance=False)
    with LogStore(root, maintenance=False) as c:
        c.create_topic("t", partitions=1)
    assert a.partitions_for("t") == 1  # cached: one partition
    with LogStore(root, maintenance=False) as b:
        b.create_partitions("t", 3)
        b.partition("t", 2).append(b"old-record")
    a.delete_topic("t")
    assert partition_dirs(root, "t") == []
    a.create_topic("t", partitions=3)
    assert a.partition("t", 2).log_end_offset == 0
    a.close()


@pytest.mark.regression
@pytest.mark.parametrize("with_metadata", [True, False])
def test_directories_a_crashed_delete_left_are_set_aside_at_open(root, with_metadata):
    with LogStore(root, maintenance=False) as s:
        s.create_topic("audit", 2)
        s.partition("audit", 0).append(b"secret")
    # what a crash inside delete_topic leaves: the topic file gone, the directories not renamed
    os.unlink(os.path.join(root, ".topics", "audit"))
    if not with_metadata:  # a directory written before topic ids
        os.unlink(os.path.join(root, "audit-0", "partition.metadata"))
    with LogStore(root, maintenance=False) as s:
        assert s.topics() == []
        assert partition_dirs(root, "audit") == []
        s.create_topic("audit", 1)
        assert s.partition("audit", 0).log_end_offset == 0
        assert read_partition_metadata(os.path.join(root, "audit-0")) == s.topic_id("audit")


@pytest.mark.regression
def test_create_topic_sets_aside_directories_left_by_an_earlier_topic(pair, root):
    a, b = pair
    with LogStore(root, maintenance=False) as c:
        c.create_topic("audit", 2)
        c.partition("audit", 1).append(b"secret")
    os.unlink(os.path.join(root, ".topics", "audit"))  # after a and b opened: no sweep ran
    a.create_topic("audit", 2)
    assert a.partition("audit", 1).log_end_offset == 0
    assert b.partition("audit", 1).log_end_offset == 0
    assert b.topic_id("audit") == a.topic_id("audit")


@pytest.mark.regression
def test_a_partition_is_not_opened_with_a_deleted_topics_id_while_it_is_created_again(root, monkeypatch):
    with LogStore(root, maintenance=False) as c:
        c.create_topic("t", 1)
        c.partition("t", 0).append(b"old")
    a = LogStore(root, maintenance=False)
    b = LogStore(root, maintenance=False)
    old_id = b.describe("t").topic_id  # b caches the old topic
    a.delete_topic("t")
    outcome = []
    opener = threading.Thread(target=lambda: outcome.append(b.partition("t", 0)))
    original = a._write_topic

    def write_then_let_b_open(*args):
        original(*args)
        opener.start()  # b opens t-0 from its cache while a is between its topic file and t-0

    monkeypatch.setattr(a, "_write_topic", write_then_let_b_open)
    a.create_topic("t", 1)
    opener.join(30)
    assert not opener.is_alive()
    new_id = a.topic_id("t")
    assert new_id != old_id
    assert outcome and outcome[0].log_end_offset == 0
    assert read_partition_metadata(os.path.join(root, "t-0")) == new_id
    assert b.topic_id("t") == new_id
    b.close()
    a.close()
    with LogStore(root, maintenance=False) as d:
        assert d.partition("t", 0).log_end_offset == 0


@pytest.mark.regression
def test_a_config_change_waiting_for_a_log_does_not_stall_other_topics(pair, monkeypatch):
    a, b = pair
    monkeypatch.setattr(store_module, "TOPIC_MAX_AGE_S", 0.0)  # every look reads the file
    a.create_topic("compacted", 1, cleanup_policy="compact")
    a.create_topic("other", 1)
    log = a.partition("compacted", 0)
    entered, release = threading.Event(), threading.Event()
    update = log.update_config

    def slow_update(config):  # a log whose lock a long cleaner pass holds
        entered.set()
        release.wait(30)
        update(config)

    monkeypatch.setattr(log, "update_config", slow_update)
    b.alter_topic_config("compacted", lambda current: {"cleanup.policy": "compact", "retention.ms": "1000"})
    looker = threading.Thread(target=a.partitions_for, args=("compacted",))
    looker.start()
    try:
        assert entered.wait(30)
        other = threading.Thread(target=a.partitions_for, args=("other",))
        other.start()
        other.join(30)
        stalled = other.is_alive()
    finally:
        release.set()
        looker.join(30)
    assert not stalled
    assert log.config.retention_ms == 1000


def test_random_interleavings_of_two_stores_agree_with_the_files(root):
    """Grow, alter, delete and create again from either of two stores, in random order, each
    acting on what it has cached (as a process does between its looks); after every step the
    files say what happened, every counted partition opens in either store with the topic's
    id and config, and no directory outlives its topic. A deletion needs the other store's
    logs closed (Kafka refuses to delete a partition another process has open): it is
    replaced by a new store object first, and the deleting one keeps its stale cache."""
    rng = random.Random(29)
    stores = [LogStore(root, maintenance=False), LogStore(root, maintenance=False)]
    topic_file = os.path.join(root, ".topics", "t")
    try:
        model: dict | None = None  # {"count", "retention", "id"} of topic "t", or None
        for step in range(150):
            i = rng.randrange(2)
            s = stores[i]
            action = rng.choice(["grow", "grow", "alter", "alter", "delete", "append", "look"])
            if model is None:
                s.create_topic("t", rng.randint(1, 3))
                entry = read_topic_entry(topic_file)
                model = {"count": entry.partitions, "retention": None, "id": entry.topic_id}
            elif action == "grow" and model["count"] < 8:
                wanted = model["count"] + rng.randint(1, 2)
                s.create_partitions("t", wanted)
                model["count"] = wanted
            elif action == "alter":
                retention = str(rng.choice([1000, 2000, 3000]))  # the same size: same-stamp rewrites
                s.alter_topic_config("t", lambda current: {"retention.ms": retention})
                model["retention"] = retention
            elif action == "delete":
                stores[1 - i].close()
                stores[1 - i] = LogStore(root, maintenance=False)
                s.delete_topic("t")
                model = None
            elif action == "look":
                count, overrides = s._topic("t", fresh=True)
                assert (count, overrides.get("retention.ms")) == (model["count"], model["retention"])
            else:
                s.partition("t", rng.randrange(model["count"])).append(b"v%d" % step)
            if model is None:
                assert not os.path.exists(topic_file)
                assert partition_dirs(root, "t") == []
                continue
            entry = read_topic_entry(topic_file)
            assert (entry.partitions, entry.overrides.get("retention.ms"), entry.topic_id) == \
                (model["count"], model["retention"], model["id"])
            for other in stores:
                for p in range(model["count"]):
                    log = other.partition("t", p)
                    if model["retention"] is not None and rng.random() < 0.2:
                        other._topic("t", fresh=True)
                        assert log.config.retention_ms == int(model["retention"])
            assert partition_dirs(root, "t") == sorted(f"t-{p}" for p in range(model["count"]))
            for p in range(model["count"]):
                assert read_partition_metadata(os.path.join(root, f"t-{p}")) == model["id"]
    finally:
        for s in stores:
            s.close()
