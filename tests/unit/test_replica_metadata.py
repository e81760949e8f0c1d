"""replica.metadata without a network: the records of ``__cluster_metadata`` applied to a store
(a topic created, its config replaced, its partitions grown), only below the high watermark,
in order, once each and again from the start without harm; a record that cannot be applied is
skipped; the command line's count against the store's. (End to end, through Kafka clients on a
replica set: tests/replication/test_metadata.py.)"""

from __future__ import annotations

import json
from types import SimpleNamespace

from logstore import LogStore
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
        assert grown[-2:] == [("t", 1), ("t", 3)]
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
