"""Topic ids (KIP-516): Kafka's partition.metadata codec, the id's home in the topic file, the
migration of a store written before topic ids, and delete/re-create."""

from __future__ import annotations

import base64
import os
import uuid

import pytest

from logstore import LogStore
from logstore.errors import InconsistentTopicIdError, LogstoreError, UnknownTopicIdError
from logstore.store.topicids import (
    decode_partition_metadata,
    encode_partition_metadata,
    new_topic_id,
    parse_topic_id,
    read_partition_metadata,
    topic_id_text,
    write_partition_metadata,
)
from logstore.store.views import StoreView

#: an id as Kafka prints it, and its bytes (base64url of 16 bytes, decoded independently)
KAFKA_TEXT = "6zOrJqXzRGaOFBVjEtnVdA"
KAFKA_ID = uuid.UUID(bytes=base64.urlsafe_b64decode(KAFKA_TEXT + "=="))


# ---------------------------------------------------------------------- the codec
def test_partition_metadata_is_kafkas_exact_text():
    # PartitionMetadata.encode: "version: 0\ntopic_id: " + Uuid.toString(), no trailing newline
    assert encode_partition_metadata(KAFKA_ID) == b"version: 0\ntopic_id: 6zOrJqXzRGaOFBVjEtnVdA"


def test_partition_metadata_round_trips_and_reads_kafkas_separators():
    assert decode_partition_metadata(encode_partition_metadata(KAFKA_ID), "p") == KAFKA_ID
    # Kafka splits on ":\s+": more whitespace and a trailing newline read the same; a newer version too
    assert decode_partition_metadata(b"version:   0\ntopic_id:\t6zOrJqXzRGaOFBVjEtnVdA\n", "p") == KAFKA_ID
    assert decode_partition_metadata(b"version: 1\ntopic_id: 6zOrJqXzRGaOFBVjEtnVdA", "p") == KAFKA_ID


@pytest.mark.parametrize("data", [
    b"", b"version: 0", b"version 0\ntopic_id: 6zOrJqXzRGaOFBVjEtnVdA",
    b"version: x\ntopic_id: 6zOrJqXzRGaOFBVjEtnVdA",
    b"version: -1\ntopic_id: 6zOrJqXzRGaOFBVjEtnVdA", b"version: 0\ntopic_id: short",
    b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA", b"version: 0\ntopic_id 6zOrJqXzRGaOFBVjEtnVdA", b"\xff\xfe",
])
def test_malformed_partition_metadata_names_the_file(data):
    with pytest.raises(LogstoreError, match="/x/partition.metadata"):
        decode_partition_metadata(data, "/x/partition.metadata")


def test_topic_id_text_is_unpadded_base64url():
    assert topic_id_text(KAFKA_ID) == KAFKA_TEXT
    assert parse_topic_id(KAFKA_TEXT) == KAFKA_ID
    assert topic_id_text(uuid.UUID(int=1)) == "AAAAAAAAAAAAAAAAAAAAAQ"
    for bad in ("", "6zOrJqXzRGaOFBVjEtnVd", "6zOrJqXzRGaOFBVjEtnVd+", "6zOrJqXzRGaOFBVjEtnVdA=="):
        with pytest.raises(ValueError):
            parse_topic_id(bad)


def test_new_ids_are_random_and_never_reserved_or_dash_led():
    ids = {new_topic_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert not {uuid.UUID(int=0), uuid.UUID(int=1)} & ids
    assert not any(topic_id_text(i).startswith("-") for i in ids)


def test_write_then_read_partition_metadata(tmp_path):
    assert read_partition_metadata(str(tmp_path)) is None
    write_partition_metadata(str(tmp_path), KAFKA_ID)
    assert (tmp_path / "partition.metadata").read_bytes() == encode_partition_metadata(KAFKA_ID)
    assert read_partition_metadata(str(tmp_path)) == KAFKA_ID
    assert not (tmp_path / "partition.metadata.tmp").exists()


# ---------------------------------------------------------------------- the store
def test_a_topic_id_lives_in_the_topic_file_and_every_partition_directory(tmp_path):
    with LogStore(tmp_path, maintenance=False) as store:
        store.create_topic("t", 3)
        topic_id = store.topic_id("t")
        assert store.describe("t").topic_id == topic_id
        assert store.topic_name(topic_id) == "t"
    text = (tmp_path / ".topics" / "t").read_text()
    assert f"topic.id={topic_id_text(topic_id)}\n" in text
    for p in range(3):
        assert (tmp_path / f"t-{p}" / "partition.metadata").read_bytes() == encode_partition_metadata(topic_id)
    with LogStore(tmp_path, maintenance=False) as store:  # survives a restart
        assert store.topic_id("t") == topic_id
        assert store.describe("t").overrides == {}  # the id is no config override
    assert StoreView(tmp_path).topic_id("t") == topic_id


def test_delete_and_create_again_gives_a_new_id(tmp_path):
    with LogStore(tmp_path, maintenance=False) as store:
        store.create_topic("t")
        old = store.topic_id("t")
        store.delete_topic("t")
        with pytest.raises(UnknownTopicIdError):
            store.topic_name(old)
        store.create_topic("t")
        new = store.topic_id("t")
        assert new != old
        assert store.topic_name(new) == "t"
        with pytest.raises(UnknownTopicIdError):
            store.topic_name(old)
    assert read_partition_metadata(str(tmp_path / "t-0")) == new


def test_a_store_without_ids_gets_them_on_open_durably(tmp_path):
    with LogStore(tmp_path, maintenance=False) as store:
        store.create_topic("a", 2, retention_ms=1000)
        store.create_topic("b")
        store.partition("a", 0).append(b"x")
    # As a store written before topic ids: no topic.id line, no partition.metadata.
    for name in ("a", "b"):
        path = tmp_path / ".topics" / name
        path.write_text("".join(line for line in path.read_text().splitlines(True) if not line.startswith("topic.id=")))
    for part in ("a-0", "a-1", "b-0"):
        (tmp_path / part / "partition.metadata").unlink()
    # ... but one partition of "b" keeps the id of a Kafka directory adopted long ago: it wins.
    write_partition_metadata(str(tmp_path / "b-0"), KAFKA_ID)
    with LogStore(tmp_path, maintenance=False) as store:
        a_id = store.topic_id("a")
        assert store.topic_id("b") == KAFKA_ID
        assert store.describe("a").overrides == {"retention.ms": "1000"}
        assert [r.value for r in store.partition("a", 0).read(0)] == [b"x"]
    assert f"topic.id={topic_id_text(a_id)}\n" in (tmp_path / ".topics" / "a").read_text()
    assert read_partition_metadata(str(tmp_path / "a-1")) == a_id
    with LogStore(tmp_path, maintenance=False) as store:  # once: the next open keeps it
        assert store.topic_id("a") == a_id


def test_a_partition_directory_of_another_topic_id_is_refused(tmp_path):
    with LogStore(tmp_path, maintenance=False) as store:
        store.create_topic("t", 2)
        topic_id = store.topic_id("t")
    write_partition_metadata(str(tmp_path / "t-1"), KAFKA_ID)
    with LogStore(tmp_path, maintenance=False) as store:
        assert store.partition("t", 0).log_end_offset == 0
        with pytest.raises(InconsistentTopicIdError, match=KAFKA_TEXT):
            store.partition("t", 1)
    assert read_partition_metadata(str(tmp_path / "t-1")) == KAFKA_ID  # left as found
    assert topic_id != KAFKA_ID


def test_a_topic_id_factory_names_every_new_id(tmp_path):
    made = uuid.UUID(int=12345)
    with LogStore(tmp_path, maintenance=False, topic_ids=lambda name: made) as store:
        store.create_topic("t")
        assert store.topic_id("t") == made


def test_an_unknown_id_is_unknown(tmp_path):
    with LogStore(tmp_path, maintenance=False) as store:
        with pytest.raises(UnknownTopicIdError):
            store.topic_name(KAFKA_ID)
    assert not os.path.exists(tmp_path / "partition.metadata")


def test_a_kafka_log_directory_read_only_shows_its_partitions_id(tmp_path):
    """StoreView adopts a Kafka log directory in memory: the id comes from partition.metadata,
    and nothing is written."""
    part = tmp_path / "orders-0"
    part.mkdir()
    (part / "00000000000000000000.log").write_bytes(b"")
    (part / "partition.metadata").write_text("version: 0\ntopic_id: 6zOrJqXzRGaOFBVjEtnVdA")
    view = StoreView(tmp_path)
    assert view.kafka_log_dir and view.topic_id("orders") == KAFKA_ID
    assert not (tmp_path / ".topics").exists()
