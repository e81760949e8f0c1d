"""replica.metadata without a network: the records of ``__cluster_metadata`` applied to a store
(a topic created, its config replaced, its partitions grown), only below the high watermark,
in order, once each and again from the start without harm; a record that cannot be applied is
skipped; the command line's count against the store's. (End to end, through Kafka clients on a
replica set: tests/replication/test_metadata.py.)"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from logstore import LogStore
from logstore.errors import RecordTooLargeError
from logstore.replica.metadata import (METADATA_TOPIC, METADATA_TOPIC_CONFIG, ReplicatedMetadata, config_record,
                                       known_partitions, partitions_record, topic_record)


def test_records_are_json_keyed_by_kind_and_topic():
    key, value = config_record("t", {"retention.ms": "5"})
    assert key == b"topic-config:t" and json.loads(value) == {"topic": "t", "configs": {"retention.ms": "5"}}
    key, value = partitions_record("t", 3)
    assert key == b"partitions:t" and json.loads(value) == {"topic": "t", "count": 3}
    key, value = topic_record("t", 2, {"cleanup.policy": "compact"})
    assert key == b"topic:t" and json.loads(value) == {"topic": "t", "count": 2,
                                                       "configs": {"cleanup.policy": "compact"}}


def _node(tmp_path):
    """A store with the metadata topic, and a ReplicatedMetadata over it whose grow hook is
    recorded (the context and leader side only need what catch_up reads)."""
    store = LogStore(str(tmp_path / "store"))
    store.create_topic(METADATA_TOPIC, 1, internal=True, **METADATA_TOPIC_CONFIG)
    log = store.partition(METADATA_TOPIC, 0)
    context = SimpleNamespace(node_id=0, replica=lambda topic, p: SimpleNamespace(log=log)
                              if (topic, p) == (METADATA_TOPIC, 0) else None)
    grown = []
    metadata = ReplicatedMetadata(context, None, store, lambda topic, count: grown.append((topic, count)))
    return store, log, metadata, grown


def test_committed_records_are_applied_in_order_and_again_without_harm(tmp_path):
    store, log, metadata, grown = _node(tmp_path)
    try:
        records = [topic_record("t", 1, {"retention.ms": "1000"}), config_record("t", {"segment.ms": "7000"}),
                   partitions_record("t", 3)]
        for key, value in records:
            log.append_batch([value], [key])
        log.high_watermark = 2  # the partitions record is not committed yet
        metadata.catch_up()
        assert store.partitions_for("t") == 1 and grown == [("t", 1)]
        config = store.partition("t", 0).config
        assert config.segment_ms == 7000 and config.retention_ms != 1000  # the whole set was replaced
        log.high_watermark = 3
        metadata.catch_up()
        assert store.partitions_for("t") == 3 and grown == [("t", 1), ("t", 3)]
        # a new node's object reads them all again from the start: nothing changes
        again = ReplicatedMetadata(metadata.context, None, store, lambda topic, count: grown.append((topic, count)))
        again.catch_up()
        assert store.partitions_for("t") == 3 and store.partition("t", 2).config.segment_ms == 7000
        assert grown[-2:] == [("t", 3), ("t", 3)]  # (a topic record: every partition the store has)
    finally:
        store.close()


def test_a_record_that_cannot_be_applied_is_skipped(tmp_path):
    store, log, metadata, grown = _node(tmp_path)
    try:
        store.create_topic("t", 1)
        log.append_batch([b"not json", json.dumps({"topic": "missing", "configs": {}}).encode(),
                          config_record("t", {"retention.ms": "soon"})[1],
                          config_record("t", {"retention.ms": "9"})[1]],
                         [b"topic-config:t", b"topic-config:missing", b"topic-config:t", b"topic-config:t"])
        log.high_watermark = log.log_end_offset
        metadata.catch_up()
        assert store.partition("t", 0).config.retention_ms == 9
    finally:
        store.close()


def test_the_stores_count_wins_over_the_command_lines(tmp_path):
    store = LogStore(str(tmp_path / "store"))
    try:
        assert known_partitions(store, "absent", 2) == 2
        store.create_topic("t", 1)
        store.create_partitions("t", 4)
        assert known_partitions(store, "t", 1) == 4
        assert known_partitions(store, "t", 6) == 4
    finally:
        store.close()


@pytest.mark.regression
def test_control_batches_and_copies_are_not_held_to_max_message_bytes(tmp_path):
    """A leader's leader-change record and a transaction marker are the server's own batches:
    a tiny max.message.bytes refuses clients' batches only, so the partition still gets leaders
    (and its followers copy the leader's batches whatever their size)."""
    store = LogStore(str(tmp_path / "store"))
    try:
        store.create_topic("tiny", 2, max_message_bytes=80)
        log, copy = store.partition("tiny", 0), store.partition("tiny", 1)
        with pytest.raises(RecordTooLargeError):
            log.append_batch([b"x" * 200], [b"k"])
        first = log.append_batch([b"v" * 200], [b"leader-change"], control=True)
        marker = log.append_txn_marker(7, 0, commit=True)
        assert (first, marker) == (0, 1) and log.log_end_offset == 2
        assert copy.append_replicated(log.read_raw(0)) == 2
        assert copy.log_end_offset == 2
    finally:
        store.close()


@pytest.mark.regression
def test_applied_records_are_never_read_again_and_a_stale_replay_keeps_the_newest_config(tmp_path):
    """A high watermark below what was applied (a new leader's) reads nothing again; a restart
    whose checkpointed high watermark is older than the newest applied config does not undo
    it (only a topic's newest config-bearing record is applied again)."""
    store, log, metadata, grown = _node(tmp_path)
    try:
        for key, value in (topic_record("t", 1, {"retention.ms": "1000"}), config_record("t", {"retention.ms": "2000"}),
                           config_record("t", {"retention.ms": "3000"})):
            log.append_batch([value], [key])
        log.high_watermark = 3
        metadata.catch_up()
        assert store.partition("t", 0).config.retention_ms == 3000
        store.alter_topic_config("t", lambda _current: {"retention.ms": "4000"})  # (a marker: nothing reapplied)
        log.high_watermark = 1  # a follower takes a new leader's lower high watermark
        metadata.catch_up()
        log.high_watermark = 3
        metadata.catch_up()
        assert store.partition("t", 0).config.retention_ms == 4000
        store.alter_topic_config("t", lambda _current: {"retention.ms": "3000"})
        log.high_watermark = 2  # restarted on a stale checkpoint: the newest record is above it
        ReplicatedMetadata(metadata.context, None, store, lambda topic, count: None).catch_up()
        assert store.partition("t", 0).config.retention_ms == 3000
    finally:
        store.close()


@pytest.mark.regression
def test_a_topic_record_over_a_topic_the_store_had_sets_its_count_and_configs(tmp_path):
    """A topic the node's command line made (one partition, no overrides) takes the created
    topic's count and overrides from its record, as every other node has them."""
    store, log, metadata, grown = _node(tmp_path)
    try:
        store.create_topic("t", 1)
        key, value = topic_record("t", 3, {"retention.ms": "5000"})
        log.append_batch([value], [key])
        log.high_watermark = 1
        metadata.catch_up()
        assert store.partitions_for("t") == 3 and grown == [("t", 3)]
        assert all(store.partition("t", p).config.retention_ms == 5000 for p in range(3))
    finally:
        store.close()
