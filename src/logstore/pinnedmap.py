"""PinnedMap: a read-only map of a segment's written bytes that Arrow tables may point into.

``Log.read_arrow(views=True)`` hands out Arrow BinaryView columns whose long keys and values are
not copied: they point into a :class:`PinnedMap` of the segment file, which the table's buffers
keep alive (the map is their ``base``). Such a map must never see its bytes change or vanish: a
page past a truncated file's end raises SIGBUS when read through a shared map, and bytes
rewritten in place would silently change a table already handed out.

The pin: a PinnedMap holds a shared ``flock`` on its own descriptor of the file for as long as it
lives. Whatever would shrink the file or rewrite bytes in place (a truncation, recovery, the
replay of a truncation journal) first calls :func:`in_place_allowed`, which tries an exclusive
``flock`` on a descriptor of its own: when any PinnedMap of the file is alive, in this process or
another, it fails, and the caller replaces the file instead (the kept bytes copied to a new file
renamed over the old one: :func:`replace_file`), leaving the pinned inode as it was until its
last map goes. Growth, appends past the pinned bytes, renames and unlinks need no check: a map of
an unlinked file stays valid. The exclusive lock is held while the in-place change runs, so a map
pinned by another process meanwhile waits for it (:class:`PinnedMap` takes its lock first, then
maps the file as it is).

Memory: a PinnedMap costs one descriptor and one mapping; its pages are the page cache's (shared,
reclaimable), resident only as far as they are read. Thread-safety: a PinnedMap is immutable once
made; the functions may be called from any thread.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator

from . import _fileio
from ._native import ffi

__all__ = ["PinnedMap", "in_place_allowed", "replace_file"]


class PinnedMap:
    """The first ``size`` bytes of a file, mapped read-only, pinned (see the module's doc) until
    the object is garbage. :attr:`address` is where they start.

    Raises:
        OSError: the file cannot be opened or mapped, or is shorter than ``size``.
        BlockingIOError: an in-place change of the file is under way (the caller copies instead).
    """

    def __init__(self, path: str, identity: tuple[int, int], size: int) -> None:
        if size <= 0:
            raise ValueError(f"a PinnedMap needs at least one byte, not {size}")
        ops = _fileio.ops
        fd = ops.open(path, os.O_RDONLY)
        try:
            if ops.identity(fd) != identity:
                raise FileNotFoundError(f"{path} no longer names the segment's file")
            if not ops.lock_shared(fd):
                raise BlockingIOError(f"{path} is being changed in place")
            if ops.fsize(fd) < size:
                raise OSError(f"{path} holds fewer than {size} bytes")
            self._mm = ops.mmap(fd, size, False)
        except BaseException:
            ops.close(fd)
            raise
        self._fd = fd
        self._ptr = ffi.from_buffer(self._mm)
        self.size = size
        #: (device, inode) of the mapped file
        self.identity = identity
        self.address = int(ffi.cast("uintptr_t", self._ptr))

    def __del__(self) -> None:
        # The map goes with the last reference (no explicit close: a buffer is exported).
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            _fileio.ops.close(fd)


@contextmanager
def in_place_allowed(path: str) -> Iterator[bool]:
    """For the block: True, holding the file's exclusive pin lock, when no PinnedMap of the file
    is alive (the caller may shrink or rewrite it in place); False when one is (it must use
    :func:`replace_file`). True as well when the file does not exist."""
    ops = _fileio.ops
    try:
        fd = ops.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield True
        return
    try:
        yield ops.lock(fd)
    finally:
        ops.close(fd)


def replace_file(path: str, fd: int, keep: int, tail: Any = b"") -> int:
    """Replace ``path`` (open as ``fd``) by a new file of its first ``keep`` bytes followed by
    ``tail``, renamed over it, instead of changing it in place (its old inode stays as it was
    for the maps pinning it). Returns a read-write descriptor of the new file; ``fd`` stays open
    (the caller closes it). Durability: the new file and the directory are fsynced before the
    rename is relied on; a crash before the rename leaves ``path`` untouched and a ``.tmp`` file
    that the log's loader removes."""
    ops = _fileio.ops
    tmp = path + ".tmp"
    new = ops.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        copied = 0
        while copied < keep:
            n = ops.copy_range(fd, new, copied, keep - copied)
            if n <= 0:
                raise OSError(f"{path} ended at {copied} bytes while copying {keep}")
            copied += n
        if len(tail):
            ops.pwrite(new, tail, keep)
        ops.fsync(new)
        ops.rename(tmp, path)
        ops.fsync_dir(os.path.dirname(path) or ".")
    except BaseException:
        ops.close(new)
        raise
    return new
