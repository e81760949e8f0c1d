"""logstore.tiered.storage: the default RemoteStorageManager copies a real segment (written by
logstore.Log) and reads it back, over memory, a local directory and SeaweedFS (S3)."""

from __future__ import annotations

import os
import uuid

import pytest

from logstore import Log
from logstore.errors import RemoteResourceNotFoundError, RemoteStorageError
from logstore.tiered.metadata import (IndexType, LogSegmentData, RemoteLogSegmentId, RemoteLogSegmentMetadata,
                                      TopicIdPartition)
from logstore.tiered.objectstore import ObjectStore
from logstore.tiered.storage import (LOG_SUFFIX, SEGMENT_SUFFIXES, ObjectStoreStorageManager, RemoteStorageManager,
                                     object_key, partition_key_prefix)

TOPIC_ID = uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
TP = TopicIdPartition(TOPIC_ID, "orders", 2)
EPOCHS = b"0\n2\n0 0\n3 250\n"


@pytest.fixture(scope="module")
def segment(tmp_path_factory) -> LogSegmentData:
    """The first sealed segment of a real log, with a transaction index and a producer
    snapshot beside it (their contents are opaque to the manager)."""
    path = str(tmp_path_factory.mktemp("log") / "orders-2")
    log = Log.open(path, {"segment_bytes": 256 << 10})
    for i in range(2000):
        log.append_batch([f"value-{i}-{j}".encode() * 5 for j in range(10)], [b"k%d" % j for j in range(10)])
    log.roll()
    base = log.segments[0].base_offset
    log.close()
    stem = os.path.join(path, f"{base:020d}")
    with open(stem + ".txnindex", "wb") as f:
        f.write(b"t" * 34)
    with open(stem + ".snapshot", "wb") as f:
        f.write(b"s" * 99)
    return LogSegmentData(stem + ".log", stem + ".index", stem + ".timeindex", stem + ".txnindex",
                          stem + ".snapshot", EPOCHS)


def _metadata(data: LogSegmentData, segment_uuid: uuid.UUID | None = None) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        RemoteLogSegmentId(TP, segment_uuid or uuid.uuid4()), start_offset=0, end_offset=999,
        max_timestamp_ms=1, broker_id=0, event_timestamp_ms=1,
        segment_size_in_bytes=os.path.getsize(data.log_segment), segment_leader_epochs={0: 0})


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture
def manager(store) -> ObjectStoreStorageManager:
    return ObjectStoreStorageManager(store)


def test_object_keys_follow_the_layout():
    metadata = RemoteLogSegmentMetadata(RemoteLogSegmentId(TP, uuid.UUID(int=0xFF)), 1234, 2000, 1, 0, 1, 10)
    # Kafka's text form of a Uuid: URL-safe base64 of its 16 bytes, no padding
    assert partition_key_prefix(TP) == "orders-a6e4EJ2tEdGAtADAT9QwyA/2/"
    assert object_key(metadata, ".log") == "orders-a6e4EJ2tEdGAtADAT9QwyA/2/00000000000000001234-AAAAAAAAAAAAAAAAAAAA_w.log"
    assert [object_key(metadata, s).rsplit("_w", 1)[1] for s in SEGMENT_SUFFIXES] == [
        ".index", ".timeindex", ".txnindex", ".snapshot", ".leader-epoch-checkpoint", ".log"]
    with pytest.raises(ValueError):
        object_key(metadata, ".deleted")


def test_copy_then_fetch_the_segment_and_every_index(manager, segment):
    metadata = _metadata(segment)
    assert manager.copy_log_segment_data(metadata, segment) is None
    log_bytes = _read(segment.log_segment)
    assert manager.fetch_log_segment(metadata, 0) == log_bytes
    assert manager.fetch_index(metadata, IndexType.OFFSET) == _read(segment.offset_index)
    assert manager.fetch_index(metadata, IndexType.TIMESTAMP) == _read(segment.time_index)
    assert manager.fetch_index(metadata, IndexType.TRANSACTION) == b"t" * 34
    assert manager.fetch_index(metadata, IndexType.PRODUCER_SNAPSHOT) == b"s" * 99
    assert manager.fetch_index(metadata, IndexType.LEADER_EPOCH) == EPOCHS
    keys = [key for key, _ in manager.object_store.list(partition_key_prefix(TP))]
    assert sorted(keys) == sorted(object_key(metadata, s) for s in SEGMENT_SUFFIXES)


def test_fetch_ranges_at_the_edges_end_inclusive(manager, segment):
    metadata = _metadata(segment)
    manager.copy_log_segment_data(metadata, segment)
    data = _read(segment.log_segment)
    size = len(data)
    assert manager.fetch_log_segment(metadata, 0, 0) == data[:1]
    assert manager.fetch_log_segment(metadata, 10, 19) == data[10:20]
    assert manager.fetch_log_segment(metadata, size - 1) == data[-1:]
    assert manager.fetch_log_segment(metadata, size - 1, size - 1) == data[-1:]
    assert manager.fetch_log_segment(metadata, 100, size + 5000) == data[100:]  # past the end: to the end
    assert manager.fetch_log_segment(metadata, size) == b""
    assert manager.fetch_log_segment(metadata, size + 7, size + 9) == b""
    with pytest.raises(ValueError):
        manager.fetch_log_segment(metadata, 10, 9)
    with pytest.raises(ValueError):
        manager.fetch_log_segment(metadata, -1)


def test_a_segment_without_txnindex_or_snapshot_fetches_them_empty(manager, segment):
    bare = LogSegmentData(segment.log_segment, segment.offset_index, segment.time_index, None, None, b"")
    metadata = _metadata(bare)
    manager.copy_log_segment_data(metadata, bare)
    assert manager.fetch_index(metadata, IndexType.TRANSACTION) == b""
    assert manager.fetch_index(metadata, IndexType.PRODUCER_SNAPSHOT) == b""
    assert manager.fetch_index(metadata, IndexType.LEADER_EPOCH) == b""
    assert len(manager.object_store.list(partition_key_prefix(TP))) == 6


def test_delete_is_idempotent_and_a_deleted_segment_is_not_found(manager, segment):
    metadata = _metadata(segment)
    manager.copy_log_segment_data(metadata, segment)
    manager.delete_log_segment_data(metadata)
    manager.delete_log_segment_data(metadata)
    manager.delete_log_segment_data(_metadata(segment))  # never copied
    assert manager.object_store.list(partition_key_prefix(TP)) == []
    with pytest.raises(RemoteResourceNotFoundError) as failure:
        manager.fetch_log_segment(metadata, 0, 10)
    assert metadata.describe() in str(failure.value)
    with pytest.raises(RemoteResourceNotFoundError) as failure:
        manager.fetch_index(metadata, IndexType.OFFSET)
    assert metadata.describe() in str(failure.value) and "OFFSET" in str(failure.value)


def test_copies_of_one_segment_under_two_ids_are_independent(manager, segment):
    first, second = _metadata(segment), _metadata(segment)
    manager.copy_log_segment_data(first, segment)
    manager.copy_log_segment_data(second, segment)
    manager.delete_log_segment_data(first)
    assert manager.fetch_log_segment(second, 0) == _read(segment.log_segment)
    assert len(manager.object_store.list(partition_key_prefix(TP))) == 6


class Recording(ObjectStore):
    """Records every put and delete; fails the put of a key ending in ``fail_suffix``."""

    def __init__(self, url: str, fail_suffix: str | None = None) -> None:
        super().__init__(url)
        self.calls: list[tuple[str, str]] = []
        self.fail_suffix = fail_suffix

    def _record(self, op: str, key: str) -> None:
        self.calls.append((op, key))
        if op == "put" and self.fail_suffix and key.endswith(self.fail_suffix):
            raise RemoteStorageError(f"put {key!r} at {self.url} failed: injected")

    def put_file(self, key: str, path: str) -> None:
        self._record("put", key)
        super().put_file(key, path)

    def put_bytes(self, key, data) -> None:
        self._record("put", key)
        super().put_bytes(key, data)

    def delete(self, key: str) -> None:
        self._record("delete", key)
        super().delete(key)


def test_a_copy_uploads_the_log_last_and_a_deletion_removes_it_first(segment):
    store = Recording("memory://")
    manager = ObjectStoreStorageManager(store)
    metadata = _metadata(segment)
    manager.copy_log_segment_data(metadata, segment)
    manager.delete_log_segment_data(metadata)
    puts = [key for op, key in store.calls if op == "put"]
    deletes = [key for op, key in store.calls if op == "delete"]
    assert puts == [object_key(metadata, s) for s in SEGMENT_SUFFIXES]
    assert deletes == [object_key(metadata, s) for s in reversed(SEGMENT_SUFFIXES)]


def test_a_failed_copy_names_the_segment_leaves_no_log_and_its_deletion_cleans_up(segment):
    store = Recording("memory://", fail_suffix=LOG_SUFFIX)
    manager = ObjectStoreStorageManager(store)
    metadata = _metadata(segment)
    with pytest.raises(RemoteStorageError) as failure:
        manager.copy_log_segment_data(metadata, segment)
    assert metadata.describe() in str(failure.value) and "injected" in str(failure.value)
    keys = [key for key, _ in store.list(partition_key_prefix(TP))]
    assert len(keys) == 5 and object_key(metadata, LOG_SUFFIX) not in keys
    manager.delete_log_segment_data(metadata)
    assert store.list() == []


def test_a_log_object_shorter_than_the_metadata_says_is_an_error(manager, segment):
    metadata = _metadata(segment)
    manager.copy_log_segment_data(metadata, segment)
    manager.object_store.put_bytes(object_key(metadata, LOG_SUFFIX), b"short")
    with pytest.raises(RemoteStorageError, match=metadata.describe().replace("[", r"\[").replace("]", r"\]")):
        manager.fetch_log_segment(metadata, 0)


def test_from_url_builds_the_default_manager(tmp_path, segment):
    with RemoteStorageManager.from_url(f"file://{tmp_path}/tier") as manager:
        assert isinstance(manager, ObjectStoreStorageManager)
        metadata = _metadata(segment)
        manager.copy_log_segment_data(metadata, segment)
    # the objects are files under the directory, by object_key
    assert _read(os.path.join(tmp_path, "tier", object_key(metadata, LOG_SUFFIX))) == _read(segment.log_segment)
    with RemoteStorageManager.from_url(f"file://{tmp_path}/tier") as again:
        assert again.fetch_index(metadata, IndexType.LEADER_EPOCH) == EPOCHS
    with pytest.raises(RemoteStorageError, match="closed"):
        manager.fetch_log_segment(metadata, 0)


def test_the_interface_is_abstract_and_a_user_class_replaces_it(segment):
    with pytest.raises(TypeError):
        RemoteStorageManager()

    class InMemory(RemoteStorageManager):
        """A user's manager: the whole segment in a dict."""

        def __init__(self) -> None:
            self.segments: dict[uuid.UUID, bytes] = {}

        def copy_log_segment_data(self, metadata, data):
            self.segments[metadata.segment_id.id] = _read(data.log_segment)
            return b"custom"

        def fetch_log_segment(self, metadata, start_position, end_position=None):
            data = self.segments[metadata.segment_id.id]
            return data[start_position:None if end_position is None else end_position + 1]

        def fetch_index(self, metadata, index_type):
            return b""

        def delete_log_segment_data(self, metadata):
            self.segments.pop(metadata.segment_id.id, None)

        def close(self):
            self.segments.clear()

    manager = InMemory()
    metadata = _metadata(segment)
    assert manager.copy_log_segment_data(metadata, segment) == b"custom"
    assert manager.fetch_log_segment(metadata, 5, 9) == _read(segment.log_segment)[5:10]
