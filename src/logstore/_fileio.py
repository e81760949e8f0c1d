"""Every file operation logstore performs, in one replaceable object.

Nothing else in the package calls ``os.open``, ``os.fsync``, ``os.rename``, ``mmap.mmap`` and
friends directly: it calls ``_fileio.ops.<name>``. Tests swap :data:`ops` for a subclass of
:class:`FileOps` (see :func:`install`) to inject I/O errors or to simulate a power loss that drops
everything written since the last fsync (tests/crash/). The hot append path writes through a
memory map and makes no calls here; a power-loss simulation therefore captures file contents at
each ``fsync`` (the page cache, mapped writes included, is what fsync makes durable).

Thread-safety: :class:`FileOps` is stateless; subclasses used by tests must be thread-safe.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from contextlib import contextmanager
from typing import Iterator

__all__ = ["FileOps", "FileRegion", "ops", "install"]


class FileOps:
    """The real file system. Methods mirror the ``os`` calls they wrap."""

    # -- descriptors
    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        """os.open with O_CLOEXEC; returns the descriptor."""
        return os.open(path, flags | os.O_CLOEXEC, mode)

    def close(self, fd: int) -> None:
        """Close a descriptor."""
        os.close(fd)

    def pread(self, fd: int, size: int, position: int) -> bytes:
        """Read up to ``size`` bytes at ``position``."""
        return os.pread(fd, size, position)

    def dup(self, fd: int) -> int:
        """A second descriptor of the same open file (close-on-exec)."""
        return os.dup(fd)

    def sendfile(self, out_fd: int, in_fd: int, position: int, count: int) -> int:
        """Copy up to ``count`` bytes of ``in_fd`` at ``position`` to the socket ``out_fd`` in
        the kernel (os.sendfile); returns the bytes sent (raises BlockingIOError when the
        socket takes none now)."""
        return os.sendfile(out_fd, in_fd, position, count)

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, position: int) -> int:
        """Write all of ``data`` at ``position`` (looping over short writes); returns the bytes written."""
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.pwrite(fd, view[written:], position + written)
        return written

    def copy_range(self, src: int, dst: int, position: int, count: int) -> int:
        """Copy up to ``count`` bytes at ``position`` of ``src`` to the same position of
        ``dst``, in the kernel where it can; returns the bytes copied (0 at the end of ``src``)."""
        try:
            return os.copy_file_range(src, dst, count, position, position)
        except OSError as exc:  # file systems or kernels without it
            if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
        data = os.pread(src, min(count, 1 << 20), position)
        return os.pwrite(dst, data, position) if data else 0

    def fsync(self, fd: int) -> None:
        """fsync a descriptor (data and metadata)."""
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        """fdatasync a descriptor (data, and the metadata needed to read it back)."""
        os.fdatasync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        """Set a file's size."""
        os.ftruncate(fd, size)

    def fallocate(self, fd: int, size: int) -> None:
        """Reserve disk blocks for [0, size) so that writes through a map cannot hit ENOSPC."""
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:  # file systems without fallocate (tmpfs on old kernels)
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)

    def fsize(self, fd: int) -> int:
        """A descriptor's file size in bytes."""
        return os.fstat(fd).st_size

    def data_end(self, fd: int) -> int:
        """Where the file's first hole starts (its size when it has none, or when the file
        system cannot tell). Bytes past it read as zeros; on tmpfs, touching a hole through a
        shared map allocates a page, and on a full tmpfs that is a SIGBUS."""
        try:
            return os.lseek(fd, 0, os.SEEK_HOLE)
        except OSError:
            return os.fstat(fd).st_size

    def mmap(self, fd: int, length: int, writable: bool) -> mmap.mmap:
        """Map ``length`` bytes of a file, shared and writable or read-only."""
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        return mmap.mmap(fd, length, access=access)

    def lock(self, fd: int, blocking: bool = False) -> bool:
        """Take an exclusive advisory lock; without ``blocking``, False if another process holds it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True

    @contextmanager
    def locked(self, lock_path: str, mode: int = 0o644) -> Iterator[None]:
        """Hold the exclusive flock of the lock file ``lock_path`` (created with ``mode`` if
        missing) for the block: one holder at a time, across processes and across threads that
        each enter it (each opens its own descriptor). Released when the block ends, by closing
        the descriptor."""
        fd = self.open(lock_path, os.O_RDWR | os.O_CREAT, mode)
        try:
            self.lock(fd, blocking=True)
            yield
        finally:
            self.close(fd)

    def identity(self, fd: int) -> tuple[int, int]:
        """(device, inode) of an open file."""
        st = os.fstat(fd)
        return st.st_dev, st.st_ino

    def path_identity(self, path: str) -> tuple[int, int] | None:
        """(device, inode) of the file a path names now, or None when there is none."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def path_stamp(self, path: str) -> tuple[int, int, int, int] | None:
        """(device, inode, size, modification time in ns) of the file a path names now, or None
        when there is none: what a reader compares to see that a small file was replaced or
        changed (an inode alone may be reused by the next replacement)."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

    def lock_shared(self, fd: int) -> bool:
        """Take a shared advisory lock without blocking; False if a process holds it exclusively."""
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def unlock(self, fd: int) -> None:
        """Release this process's flock on a descriptor."""
        fcntl.flock(fd, fcntl.LOCK_UN)

    # -- paths
    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        return os.path.exists(path)

    def size(self, path: str) -> int:
        """A file's size in bytes, by path."""
        return os.stat(path).st_size

    def listdir(self, path: str) -> list[str]:
        """Names in a directory."""
        return os.listdir(path)

    def makedirs(self, path: str) -> None:
        """Create a directory and its parents (existing ones are fine)."""
        os.makedirs(path, exist_ok=True)

    def rename(self, src: str, dst: str) -> None:
        """Rename atomically (not durable until the directory is fsynced)."""
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        """Remove a file (not durable until the directory is fsynced)."""
        os.unlink(path)

    def rmdir(self, path: str) -> None:
        """Remove an empty directory."""
        os.rmdir(path)

    def remove_tree(self, path: str) -> None:
        """Remove a directory and everything in it, one unlink/rmdir at a time through this
        FileOps (so that a fault-injecting subclass sees each); entries that vanish meanwhile
        are fine. Not durable until the parent directory is fsynced."""
        try:
            names = self.listdir(path)
        except FileNotFoundError:
            return
        for name in names:
            child = os.path.join(path, name)
            try:
                if os.path.isdir(child) and not os.path.islink(child):
                    self.remove_tree(child)
                else:
                    self.unlink(child)
            except FileNotFoundError:
                pass
        try:
            self.rmdir(path)
        except FileNotFoundError:
            pass

    def fsync_dir(self, path: str) -> None:
        """fsync a directory so that creates, renames and unlinks in it are durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def map_file(self, path: str) -> "mmap.mmap | bytes":
        """A whole file mapped read-only (b"" when it is empty: an empty file cannot be mapped).
        The map stays valid after the descriptor is closed; the caller closes the map."""
        fd = self.open(path, os.O_RDONLY)
        try:
            size = self.fsize(fd)
            return self.mmap(fd, size, False) if size else b""
        finally:
            self.close(fd)

    def read_file(self, path: str) -> bytes:
        """A whole file's bytes."""
        fd = self.open(path, os.O_RDONLY)
        try:
            chunks: list[bytes] = []
            position = 0
            while True:
                chunk = self.pread(fd, 1 << 20, position)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
                position += len(chunk)
        finally:
            self.close(fd)

    def makedirs_durable(self, path: str) -> None:
        """Create a directory and its missing parents, and fsync the parent of each one
        created, so that the new names survive a power loss (a new directory is not durable
        until its parent is fsynced). Existing directories are fine and cost nothing."""
        missing = []
        p = os.path.abspath(path)
        while not os.path.isdir(p):
            missing.append(p)
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
        self.makedirs(path)
        for created in reversed(missing):
            self.fsync_dir(os.path.dirname(created))

    def write_new_file(self, path: str, data: bytes | bytearray | memoryview) -> None:
        """Create (or truncate) ``path``, write ``data`` and fsync it; the caller makes the
        directory entry durable (rename into place, fsync the directory)."""
        fd = self.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            self.pwrite(fd, data, 0)
            self.fsync(fd)
        finally:
            self.close(fd)

    def write_file_atomic(self, path: str, data: bytes, tmp: str | None = None) -> None:
        """Replace ``path`` with ``data`` durably: temp file (``tmp``, default ``path + ".tmp"``),
        fsync, rename, fsync directory (both directories when ``tmp`` is elsewhere).

        A crash at any point leaves either the old or the new content, never a mix.
        """
        tmp = path + ".tmp" if tmp is None else tmp
        self.write_new_file(tmp, data)
        self.rename(tmp, path)
        target_dir = os.path.dirname(os.path.abspath(path))
        self.fsync_dir(target_dir)
        tmp_dir = os.path.dirname(os.path.abspath(tmp))
        if tmp_dir != target_dir:
            self.fsync_dir(tmp_dir)


#: The FileOps every module uses. Replace it only through :func:`install`.
class FileRegion:
    """``length`` bytes of an open file from ``position``: a part of an answer that the network
    layer writes to a socket with ``sendfile`` (the file's pages go to the socket in the kernel,
    never through Python objects: Kafka's zero-copy fetch).

    The region owns its descriptor (a ``dup`` of the file's, so that the file may be closed or
    deleted meanwhile and the bytes stay readable): :meth:`close` releases it, and a region
    dropped unclosed closes it when collected. Not thread-safe: one owner at a time (the
    handler that made it, then the connection writing it).
    """

    __slots__ = ("fd", "position", "length", "end_offset")

    def __init__(self, fd: int, position: int, length: int, end_offset: int = -1) -> None:
        self.fd = fd
        self.position = position
        self.length = length
        #: the offset after the region's last batch when its maker knows it (-1: unknown)
        self.end_offset = end_offset

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd}, position={self.position}, length={self.length})"

    def read(self) -> bytes:
        """The region's bytes (for a socket sendfile cannot write to: TLS); closes the region."""
        try:
            out = bytearray()
            while len(out) < self.length:
                chunk = ops.pread(self.fd, self.length - len(out), self.position + len(out))
                if not chunk:
                    raise OSError(errno.EIO, f"a file region ends {self.length - len(out)} bytes early")
                out += chunk
            return bytes(out)
        finally:
            self.close()

    def close(self) -> None:
        """Release the descriptor (idempotent)."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            try:
                ops.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass


ops: FileOps = FileOps()


@contextmanager
def install(replacement: FileOps) -> Iterator[FileOps]:
    """Use ``replacement`` for every file operation inside the ``with`` block (tests only)."""
    global ops
    previous = ops
    ops = replacement
    try:
        yield replacement
    finally:
        ops = previous
