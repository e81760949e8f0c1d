"""logstore.tiered.objectstore: round trips, ranges at the edges, multipart puts, deletion,
listing and errors, over memory, a local directory and SeaweedFS (S3)."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from logstore import _fileio
from logstore.errors import InvalidConfigError, RemoteResourceNotFoundError, RemoteStorageError
from logstore.tiered.objectstore import PART_SIZE, open_object_store


def _write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


class FailingRead(_fileio.FileOps):
    """Fails the ``fail_at``-th pread (1-based) of a file named ``name`` with EIO."""

    def __init__(self, name: str, fail_at: int) -> None:
        self.name = name
        self.fail_at = fail_at
        self.reads = 0
        self.names: dict[int, str] = {}
        self.lock = threading.Lock()

    def open(self, path, flags, mode=0o644):
        fd = super().open(path, flags, mode)
        self.names[fd] = os.path.basename(path)
        return fd

    def pread(self, fd, size, position):
        if self.names.get(fd) == self.name:
            with self.lock:
                self.reads += 1
                if self.reads == self.fail_at:
                    raise OSError(errno.EIO, "injected read error")
        return super().pread(fd, size, position)


def test_bytes_round_trip_size_and_list(store):
    store.put_bytes("t/0/a", b"hello")
    store.put_bytes("t/0/b", b"world!")
    assert store.get("t/0/a") == b"hello"
    assert store.size("t/0/b") == 6
    assert store.size("t/0/c") is None
    assert store.list("t/0/") == [("t/0/a", 5), ("t/0/b", 6)]


def test_a_put_replaces_the_object(store):
    store.put_bytes("k", b"first")
    store.put_bytes("k", b"second")
    assert store.get("k") == b"second"


def test_ranges_at_the_edges(store):
    data = bytes(range(256)) * 4
    store.put_bytes("r", data)
    size = len(data)
    assert store.get_range("r", 0, 1) == data[:1]
    assert store.get_range("r", size - 1, size) == data[-1:]
    assert store.get_range("r", 0, size) == data
    assert store.get_range("r", 100, 300) == data[100:300]
    assert store.get_range("r", size - 10, size + 1000) == data[-10:]  # cut at the object's end
    assert store.get_range("r", 5, None) == data[5:]
    assert store.get_range("r", 7, 7) == b""  # empty: no request
    with pytest.raises(RemoteStorageError, match="'r'"):
        store.get_range("r", size, size + 1)  # starts at the end: the stores refuse it
    with pytest.raises(ValueError):
        store.get_range("r", 5, 4)
    with pytest.raises(ValueError):
        store.get_range("r", -1, 4)


def test_empty_file_and_empty_bytes(store, tmp_path):
    store.put_file("e/file", _write(tmp_path / "empty", b""))
    store.put_bytes("e/bytes", b"")
    assert store.get("e/file") == b""
    assert store.get("e/bytes") == b""
    assert store.list("e/") == [("e/bytes", 0), ("e/file", 0)]


def test_a_20_mb_file_goes_up_in_parts_and_reads_back(store, tmp_path):
    data = os.urandom(20 << 20)
    assert len(data) > 2 * PART_SIZE  # three parts of a multipart upload
    store.put_file("big/segment.log", _write(tmp_path / "big", data))
    assert store.size("big/segment.log") == len(data)
    assert store.get("big/segment.log") == data
    # a range across the boundary of the first two parts
    assert store.get_range("big/segment.log", PART_SIZE - 100, PART_SIZE + 100) == data[PART_SIZE - 100:PART_SIZE + 100]


def test_delete_is_idempotent(store):
    store.put_bytes("d/x", b"1")
    store.delete("d/x")
    store.delete("d/x")
    store.delete("d/never-was")
    assert store.size("d/x") is None
    assert store.list("d/") == []


def test_list_is_by_string_prefix_and_sorted(store):
    for key in ("a/b1", "a/bc", "a/b/c", "a/c", "ab", "z"):
        store.put_bytes(key, key.encode())
    assert store.list("a/b") == [("a/b/c", 5), ("a/b1", 4), ("a/bc", 4)]
    assert store.list("a/") == [("a/b/c", 5), ("a/b1", 4), ("a/bc", 4), ("a/c", 3)]
    assert [k for k, _ in store.list()] == ["a/b/c", "a/b1", "a/bc", "a/c", "ab", "z"]
    assert store.list("nothing/") == []


def test_a_missing_object_is_not_found_naming_key_and_store(store):
    for call in (lambda: store.get("no/such"), lambda: store.get_range("no/such", 0, 10),
                 lambda: store.get_range("no/such", 3, None)):
        with pytest.raises(RemoteResourceNotFoundError) as failure:
            call()
        assert "'no/such'" in str(failure.value) and store.url in str(failure.value)


def test_a_failed_local_read_aborts_the_put_and_leaves_no_object(store, tmp_path):
    big = _write(tmp_path / "big.log", os.urandom(3 * PART_SIZE + 5))
    small = _write(tmp_path / "small.index", b"i" * 1000)
    store.put_bytes("seg/small.index", b"old")
    with _fileio.install(FailingRead("big.log", fail_at=2)):
        with pytest.raises(RemoteStorageError) as failure:
            store.put_file("seg/big.log", big)
    message = str(failure.value)
    assert "'seg/big.log'" in message and big in message and "injected read error" in message
    with _fileio.install(FailingRead("small.index", fail_at=1)):
        with pytest.raises(RemoteStorageError, match="small.index"):
            store.put_file("seg/small.index", small)
    assert store.list("seg/") == [("seg/small.index", 3)]  # no new object, the old one untouched
    assert store.get("seg/small.index") == b"old"
    store.put_file("seg/big.log", big)  # the retry succeeds
    assert store.get("seg/big.log") == open(big, "rb").read()


def test_a_missing_local_file_is_a_remote_storage_error(store, tmp_path):
    with pytest.raises(RemoteStorageError, match="no-such-file"):
        store.put_file("k", str(tmp_path / "no-such-file"))


def test_threads_share_one_store(store):
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(10):
                key = f"threads/{n}/{i}"
                store.put_bytes(key, f"{n}-{i}".encode() * 100)
                assert store.get(key) == f"{n}-{i}".encode() * 100
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.list("threads/")) == 40


def test_a_closed_store_refuses_every_call(store_url):
    url, options = store_url
    store = open_object_store(url, options)
    store.close()
    store.close()
    with pytest.raises(RemoteStorageError, match="closed"):
        store.put_bytes("k", b"v")
    with pytest.raises(RemoteStorageError, match="closed"):
        store.list()


def test_bad_keys_are_value_errors():
    store = open_object_store("memory://")
    for key in ("", "/a", "a/", "a//b", "a/../b", "./a"):
        with pytest.raises(ValueError):
            store.put_bytes(key, b"")
    with pytest.raises(ValueError):
        store.list("/a")


@pytest.mark.parametrize("url, options", [
    ("ftp://host/x", {}),
    ("file://relative/path", {}),
    ("memory:///some/path", {}),
    ("memory://", {"region": "x"}),
    ("s3://bucket", {"no_such_option": "1"}),
    ("s3://bucket", {"timeout": "5s"}),
])
def test_bad_urls_and_options_are_config_errors(url, options):
    with pytest.raises(InvalidConfigError):
        open_object_store(url, options)


def test_bad_limits_are_config_errors():
    with pytest.raises(InvalidConfigError):
        open_object_store("memory://", request_timeout=0)
    with pytest.raises(InvalidConfigError):
        open_object_store("memory://", max_retries=-1)


def test_a_local_directory_that_cannot_be_made_is_a_remote_storage_error(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(RemoteStorageError, match="file/remote"):
        open_object_store(f"file://{tmp_path}/file/remote")


def test_a_local_directory_is_made_and_every_key_lies_under_its_path(tmp_path):
    root = tmp_path / "not" / "yet"
    store = open_object_store(f"file://{root}")
    assert root.is_dir()
    store.put_bytes("p/0/x.log", b"data")
    assert (root / "p" / "0" / "x.log").read_bytes() == b"data"
    assert store.url == f"file://{root}"


class RecordingSyncs(_fileio.FileOps):
    def __init__(self) -> None:
        self.paths: dict[int, str] = {}
        self.synced: list[str] = []

    def open(self, path, flags, mode=0o644):
        fd = super().open(path, flags, mode)
        self.paths[fd] = path
        return fd

    def fsync(self, fd):
        self.synced.append(self.paths[fd])
        super().fsync(fd)

    def fsync_dir(self, path):
        self.synced.append(path + "/")
        super().fsync_dir(path)


def test_a_local_put_is_fsynced_with_its_directories_before_it_returns(tmp_path):
    root = str(tmp_path / "remote")
    store = open_object_store(f"file://{root}")
    with _fileio.install(RecordingSyncs()) as ops:
        store.put_bytes("t/0/seg.index", b"x")
    assert ops.synced == [f"{root}/t/0/seg.index", f"{root}/t/0/", f"{root}/t/", f"{root}/"]
    with _fileio.install(RecordingSyncs()) as ops:
        store.delete("t/0/seg.index")
    assert ops.synced == [f"{root}/t/0/"]


def test_the_url_prefix_is_part_of_every_key(s3_server, s3_bucket):
    prefixed = open_object_store(f"{s3_bucket}/tier/one", s3_server.options())
    prefixed.put_bytes("t/0/a", b"x")
    assert prefixed.list() == [("t/0/a", 1)]
    whole = open_object_store(s3_bucket, s3_server.options())
    assert whole.list() == [("tier/one/t/0/a", 1)]


def test_s3_credentials_and_endpoint_from_the_environment(s3_server, s3_bucket, monkeypatch):
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    store = open_object_store(s3_bucket)  # http:// endpoint from AWS_ENDPOINT_URL: plain HTTP allowed
    store.put_bytes("env/k", b"v")
    assert store.get("env/k") == b"v"


def test_s3_wrong_credentials_fail_naming_the_key_and_no_secret(s3_server, s3_bucket):
    options = s3_server.options(secret_access_key="not-the-secret-key")
    store = open_object_store(s3_bucket, options, max_retries=0)
    with pytest.raises(RemoteStorageError) as failure:
        store.put_bytes("k/v", b"1")
    message = str(failure.value)
    assert "'k/v'" in message and s3_bucket in message
    assert "not-the-secret-key" not in message and "not-the-secret-key" not in repr(store)


def test_messages_and_the_url_drop_credentials():
    with pytest.raises(InvalidConfigError) as failure:
        open_object_store("ftp://user:secret@host/x")
    assert "secret" not in str(failure.value) and "ftp://host/x" in str(failure.value)


def test_options_given_as_name_value_strings():
    from logstore.tiered.objectstore import parse_options

    assert parse_options(["endpoint = http://127.0.0.1:1", "allow_http=true", "empty="]) == \
        {"endpoint": "http://127.0.0.1:1", "allow_http": "true", "empty": ""}
    for bad in ("novalue", "=x"):
        with pytest.raises(ValueError, match="expected NAME=VALUE"):
            parse_options([bad])
