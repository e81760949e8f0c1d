"""Faults of a real S3 server (SeaweedFS, one per test): stopped, frozen, killed in the middle of
a multipart upload. Every call fails with a RemoteStorageError naming the key (or the segment)
within the request timeout and its retries, and the same call succeeds once the server is back."""

from __future__ import annotations

import os
import time
import uuid
from typing import Iterator

import pytest

from logstore import Log, _fileio
from logstore.errors import RemoteResourceNotFoundError, RemoteStorageError
from logstore.tiered.metadata import (LogSegmentData, RemoteLogSegmentId, RemoteLogSegmentMetadata,
                                      TopicIdPartition)
from logstore.tiered.objectstore import PART_SIZE, ObjectStore, open_object_store
from logstore.tiered.storage import ObjectStoreStorageManager

from .conftest import seaweedfs_or_skip
from logstore.seaweedfs import SeaweedFS

#: Short, so that a test of a dead server takes seconds: (1 + retries) attempts of 1 s at most.
TIMEOUT = 1.0
RETRIES = 1


@pytest.fixture
def server(tmp_path) -> Iterator[SeaweedFS]:
    """A SeaweedFS of this test's own, which it may stop and start."""
    own = seaweedfs_or_skip(str(tmp_path / "seaweedfs"))
    try:
        yield own
    finally:
        own.kill()


@pytest.fixture
def store(server) -> ObjectStore:
    return open_object_store(f"s3://{server.create_bucket()}", server.options(), request_timeout=TIMEOUT,
                             max_retries=RETRIES)


def _failures_name_the_key(store: ObjectStore, big: str, every_call: bool = True) -> None:
    calls = [("new/k", lambda: store.put_bytes("new/k", b"v")),
             ("before", lambda: store.get_range("before", 1, 3)),
             ("new/big", lambda: store.put_file("new/big", big))]
    if every_call:
        calls += [("before", lambda: store.get("before")), ("before", lambda: store.delete("before")),
                  ("before", lambda: store.size("before")), ("", lambda: store.list())]
    for key, call in calls:
        with pytest.raises(RemoteStorageError) as failure:
            call()
        assert not isinstance(failure.value, RemoteResourceNotFoundError)  # unreachable, not absent
        assert repr(key) in str(failure.value) and store.url in str(failure.value)


def test_a_stopped_server_fails_every_call_and_a_retry_after_its_restart_succeeds(server, store, tmp_path):
    big = str(tmp_path / "big")
    with open(big, "wb") as f:
        f.write(os.urandom(2 * PART_SIZE + 1))
    store.put_bytes("before", b"stored before the stop")
    server.kill()
    _failures_name_the_key(store, big)
    server.start()
    store.put_bytes("new/k", b"v")
    store.put_file("new/big", big)
    assert store.get("before") == b"stored before the stop"
    assert store.get("new/big") == open(big, "rb").read()


def test_a_frozen_server_times_out_and_answers_again_when_thawed(server, store, tmp_path):
    big = str(tmp_path / "big")
    with open(big, "wb") as f:
        f.write(os.urandom(PART_SIZE + 1))
    store.put_bytes("before", b"stored before the freeze")
    server.pause()
    try:
        _failures_name_the_key(store, big, every_call=False)  # each waits for its timeouts
    finally:
        server.resume()
    # Thawed, the server may take a moment (its own timers ran out while it was frozen) beyond
    # this store's 1 s request timeout, more so on a loaded machine: it answers again within 30 s.
    deadline = time.monotonic() + 30
    while True:
        try:
            store.put_file("new/big", big)
            break
        except RemoteStorageError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert store.get_range("before", 7, 13) == b"before"


class KillOnRead(_fileio.FileOps):
    """Kills the server at the ``at``-th read of a file named ``name``: an upload cut short."""

    def __init__(self, server: SeaweedFS, name: str, at: int) -> None:
        self.server = server
        self.name = name
        self.at = at
        self.reads = 0
        self.fds: set[int] = set()

    def open(self, path, flags, mode=0o644):
        fd = super().open(path, flags, mode)
        if os.path.basename(path) == self.name:
            self.fds.add(fd)
        return fd

    def pread(self, fd, size, position):
        if fd in self.fds:
            self.reads += 1
            if self.reads == self.at:
                self.server.kill()
        return super().pread(fd, size, position)


def test_a_server_killed_during_a_multipart_upload_leaves_no_object(server, store, tmp_path):
    big = str(tmp_path / "segment.log")
    data = os.urandom(4 * PART_SIZE)
    with open(big, "wb") as f:
        f.write(data)
    with _fileio.install(KillOnRead(server, "segment.log", at=3)):
        with pytest.raises(RemoteStorageError, match="'t/0/segment.log'"):
            store.put_file("t/0/segment.log", big)
    server.start()
    assert store.size("t/0/segment.log") is None
    assert store.list("t/") == []
    store.put_file("t/0/segment.log", big)
    assert store.get("t/0/segment.log") == data


def test_a_copy_to_a_stopped_server_names_the_segment_and_is_retried_whole(server, store, tmp_path):
    path = str(tmp_path / "log")
    log = Log.open(path, {"segment_bytes": 64 << 10})
    for i in range(500):
        log.append_batch([b"x" * 100] * 10)
    log.roll()
    log.close()
    stem = os.path.join(path, f"{0:020d}")
    data = LogSegmentData(stem + ".log", stem + ".index", stem + ".timeindex", None, None, b"0\n1\n0 0\n")
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    metadata = RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(tp), 0, 10, 1, 0, 1,
                                        os.path.getsize(data.log_segment))
    manager = ObjectStoreStorageManager(store)
    server.kill()
    with pytest.raises(RemoteStorageError) as failure:
        manager.copy_log_segment_data(metadata, data)
    assert metadata.describe() in str(failure.value)
    with pytest.raises(RemoteStorageError) as failure:
        manager.fetch_log_segment(metadata, 0, 100)
    assert metadata.describe() in str(failure.value)
    server.start()
    manager.copy_log_segment_data(metadata, data)
    assert manager.fetch_log_segment(metadata, 0) == open(data.log_segment, "rb").read()
