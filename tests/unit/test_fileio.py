"""Unit tests of logstore._fileio: the replaceable FileOps and its atomic write."""

from __future__ import annotations

import errno
import os
import pathlib

import pytest

from logstore import _fileio
from logstore._fileio import FileOps


@pytest.fixture
def ops() -> FileOps:
    return FileOps()


# ---------------------------------------------------------------------- write_file_atomic
def test_write_file_atomic_creates_file_and_leaves_no_tmp(ops: FileOps, tmp_path: pathlib.Path) -> None:
    target = tmp_path / "state"
    ops.write_file_atomic(str(target), b"hello")
    assert target.read_bytes() == b"hello"
    assert os.listdir(tmp_path) == ["state"]


def test_write_file_atomic_replaces_longer_content_completely(ops: FileOps, tmp_path: pathlib.Path) -> None:
    target = tmp_path / "state"
    target.write_bytes(b"x" * 10_000)
    ops.write_file_atomic(str(target), b"short")
    assert target.read_bytes() == b"short"
    assert not (tmp_path / "state.tmp").exists()


def test_write_file_atomic_overwrites_a_stale_tmp_from_a_crash(ops: FileOps, tmp_path: pathlib.Path) -> None:
    target = tmp_path / "state"
    (tmp_path / "state.tmp").write_bytes(b"torn leftover from an earlier crash, longer than the data")
    ops.write_file_atomic(str(target), b"new")
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["state"]


def test_write_file_atomic_fsyncs_file_then_renames_then_fsyncs_directory(tmp_path: pathlib.Path) -> None:
    events: list[tuple[str, str]] = []

    class Recording(FileOps):
        def fsync(self, fd: int) -> None:
            events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            super().fsync(fd)

        def rename(self, src: str, dst: str) -> None:
            events.append(("rename", dst))
            super().rename(src, dst)

        def fsync_dir(self, path: str) -> None:
            events.append(("fsync_dir", path))
            super().fsync_dir(path)

    target = str(tmp_path / "state")
    Recording().write_file_atomic(target, b"data")
    assert events == [("fsync", target + ".tmp"), ("rename", target), ("fsync_dir", str(tmp_path))]


def test_failed_fsync_leaves_the_old_content_in_place(tmp_path: pathlib.Path) -> None:
    class FailingFsync(FileOps):
        def fsync(self, fd: int) -> None:
            raise OSError(errno.EIO, "injected")

    target = tmp_path / "state"
    target.write_bytes(b"old")
    with pytest.raises(OSError, match="injected"):
        FailingFsync().write_file_atomic(str(target), b"new")
    assert target.read_bytes() == b"old"


def test_write_file_atomic_with_relative_path_fsyncs_its_directory(
    ops: FileOps, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ops.write_file_atomic("plain", b"1")  # dirname("") must not be fsynced as ""
    assert (tmp_path / "plain").read_bytes() == b"1"


# ---------------------------------------------------------------------- descriptors
def test_pwrite_and_pread_at_positions(ops: FileOps, tmp_path: pathlib.Path) -> None:
    fd = ops.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT)
    try:
        assert ops.pwrite(fd, b"abcdef", 0) == 6
        assert ops.pwrite(fd, memoryview(b"XY"), 2) == 2
        assert ops.pread(fd, 100, 0) == b"abXYef"
        assert ops.pread(fd, 2, 4) == b"ef"
        assert ops.fsize(fd) == 6
        ops.ftruncate(fd, 3)
        assert ops.pread(fd, 100, 0) == b"abX"
    finally:
        ops.close(fd)


def test_opened_descriptors_are_close_on_exec(ops: FileOps, tmp_path: pathlib.Path) -> None:
    fd = ops.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT)
    try:
        assert os.get_inheritable(fd) is False
    finally:
        ops.close(fd)


def test_read_file_reads_more_than_one_chunk(ops: FileOps, tmp_path: pathlib.Path) -> None:
    data = os.urandom((1 << 20) + 123)
    (tmp_path / "big").write_bytes(data)
    assert ops.read_file(str(tmp_path / "big")) == data
    (tmp_path / "empty").write_bytes(b"")
    assert ops.read_file(str(tmp_path / "empty")) == b""


def test_fallocate_reserves_the_size(ops: FileOps, tmp_path: pathlib.Path) -> None:
    fd = ops.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT)
    try:
        ops.fallocate(fd, 65536)
        assert ops.fsize(fd) == 65536
    finally:
        ops.close(fd)


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL])
def test_fallocate_falls_back_to_ftruncate_where_unsupported(
    ops: FileOps, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    def unsupported(fd: int, offset: int, length: int) -> None:
        raise OSError(code, "not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    fd = ops.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT)
    try:
        ops.fallocate(fd, 8192)
        assert ops.fsize(fd) == 8192
        ops.fallocate(fd, 100)  # never shrinks
        assert ops.fsize(fd) == 8192
    finally:
        ops.close(fd)


def test_fallocate_on_full_disk_raises(ops: FileOps, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    fd = ops.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT)
    try:
        with pytest.raises(OSError) as info:
            ops.fallocate(fd, 8192)
        assert info.value.errno == errno.ENOSPC
        assert ops.fsize(fd) == 0
    finally:
        ops.close(fd)


def test_mmap_writable_and_read_only(ops: FileOps, tmp_path: pathlib.Path) -> None:
    fd = ops.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT)
    try:
        ops.ftruncate(fd, 16)
        mm = ops.mmap(fd, 16, True)
        mm[0:4] = b"abcd"
        mm.close()
        ro = ops.mmap(fd, 16, False)
        try:
            assert ro[0:4] == b"abcd"
            with pytest.raises(TypeError):
                ro[0:1] = b"z"
        finally:
            ro.close()
    finally:
        ops.close(fd)


def test_lock_is_exclusive_across_descriptors_and_released_by_close(ops: FileOps, tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / ".lock")
    a = ops.open(path, os.O_RDWR | os.O_CREAT)
    b = ops.open(path, os.O_RDWR | os.O_CREAT)
    try:
        assert ops.lock(a) is True
        assert ops.lock(b) is False  # flock conflicts between open file descriptions
        ops.close(a)
        a = -1
        assert ops.lock(b) is True
    finally:
        for fd in (a, b):
            if fd >= 0:
                ops.close(fd)


# ---------------------------------------------------------------------- paths
def test_path_operations(ops: FileOps, tmp_path: pathlib.Path) -> None:
    d = tmp_path / "a" / "b"
    ops.makedirs(str(d))
    ops.makedirs(str(d))  # exist_ok
    (d / "x").write_bytes(b"123")
    assert ops.exists(str(d / "x")) and ops.size(str(d / "x")) == 3
    assert ops.listdir(str(d)) == ["x"]
    (d / "y").write_bytes(b"old")
    ops.rename(str(d / "x"), str(d / "y"))  # replaces an existing target
    assert (d / "y").read_bytes() == b"123" and not ops.exists(str(d / "x"))
    ops.fsync_dir(str(d))
    ops.unlink(str(d / "y"))
    ops.rmdir(str(d))
    assert not ops.exists(str(d))


# ---------------------------------------------------------------------- install
def test_install_swaps_ops_for_the_block_and_restores_it() -> None:
    original = _fileio.ops
    replacement = FileOps()
    with _fileio.install(replacement) as installed:
        assert installed is replacement
        assert _fileio.ops is replacement
    assert _fileio.ops is original


def test_install_restores_ops_after_an_exception() -> None:
    original = _fileio.ops
    with pytest.raises(RuntimeError):
        with _fileio.install(FileOps()):
            raise RuntimeError("boom")
    assert _fileio.ops is original


def test_nested_installs_unwind_in_order() -> None:
    original = _fileio.ops
    outer, inner = FileOps(), FileOps()
    with _fileio.install(outer):
        with _fileio.install(inner):
            assert _fileio.ops is inner
        assert _fileio.ops is outer
    assert _fileio.ops is original



# ---------------------------------------------------------------------- directories
class _Recording(FileOps):
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def fsync_dir(self, path: str) -> None:
        self.calls.append(("fsync_dir", path))
        super().fsync_dir(path)

    def unlink(self, path: str) -> None:
        self.calls.append(("unlink", path))
        super().unlink(path)

    def rmdir(self, path: str) -> None:
        self.calls.append(("rmdir", path))
        super().rmdir(path)


def test_makedirs_durable_fsyncs_the_parent_of_every_directory_it_creates(tmp_path: pathlib.Path) -> None:
    ops = _Recording()
    target = tmp_path / "a" / "b" / "c"
    ops.makedirs_durable(str(target))
    assert target.is_dir()
    assert ops.calls == [("fsync_dir", str(tmp_path)), ("fsync_dir", str(tmp_path / "a")),
                         ("fsync_dir", str(tmp_path / "a" / "b"))]
    ops.calls.clear()
    ops.makedirs_durable(str(target))  # existing: nothing to make durable
    assert ops.calls == []


def test_remove_tree_goes_through_the_file_operations_one_entry_at_a_time(tmp_path: pathlib.Path) -> None:
    ops = _Recording()
    root = tmp_path / "t.x-delete"
    (root / "sub").mkdir(parents=True)
    (root / "f").write_bytes(b"1")
    (root / "sub" / "g").write_bytes(b"2")
    ops.remove_tree(str(root))
    assert not root.exists()
    assert sorted(ops.calls) == sorted([("unlink", str(root / "f")), ("unlink", str(root / "sub" / "g")),
                                        ("rmdir", str(root / "sub")), ("rmdir", str(root))])
    ops.remove_tree(str(root))  # already gone: fine


def test_data_end_is_where_the_first_hole_starts(ops: FileOps) -> None:
    import tempfile

    if not os.path.isdir("/dev/shm"):
        pytest.skip("needs a tmpfs at /dev/shm (a file system that reports holes)")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        fd = ops.open(os.path.join(d, "sparse"), os.O_RDWR | os.O_CREAT)
        try:
            assert ops.data_end(fd) == 0
            ops.pwrite(fd, b"x" * 4096, 0)
            ops.ftruncate(fd, 1 << 20)  # a hole after the first page
            assert ops.data_end(fd) == 4096
            ops.pwrite(fd, b"y" * 4096, (1 << 20) - 4096)
            assert ops.data_end(fd) == 4096  # the first hole, not the last
        finally:
            ops.close(fd)


def test_locked_holds_one_holder_at_a_time_across_threads(tmp_path):
    """``FileOps.locked``: the flock of a lock file, one holder at a time (each entry opens its
    own descriptor, so threads of one process exclude each other as processes do)."""
    import threading

    path = str(tmp_path / ".lock-x")
    inside, peak, lock = [0], [0], threading.Lock()

    def enter():
        for _ in range(20):
            with _fileio.ops.locked(path):
                with lock:
                    inside[0] += 1
                    peak[0] = max(peak[0], inside[0])
                threading.Event().wait(0.001)
                with lock:
                    inside[0] -= 1

    threads = [threading.Thread(target=enter) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert peak[0] == 1 and inside[0] == 0
