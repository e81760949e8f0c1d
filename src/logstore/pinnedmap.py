"""PinnedMap: a read-only map of a segment's written bytes that Arrow tables may point into.

``Log.read_arrow(views=True)`` hands out Arrow BinaryView columns whose long keys and values are
not copied: they point into a :class:`PinnedMap` of the segment file, which the table's buffers
keep alive (the map is their ``base``). Such a map must never see its bytes change or vanish: a
page past a truncated file's end raises SIGBUS when read through a shared map, and bytes
rewritten in place would silently change a table already handed out.

The pin: a PinnedMap holds a shared ``flock`` on its own open file description of the file for
as long as it lives (the mmap's descriptor, a dup of the one the lock was taken on, which is
closed once the map is made: one descriptor per PinnedMap). Whatever would shrink the file or rewrite bytes in place (a truncation, recovery, the
replay of a truncation journal) first calls :func:`in_place_allowed`, which tries an exclusive
``flock`` on a descriptor of its own: when any PinnedMap of the file is alive, in this process or
another, it fails, and the caller replaces the file instead (the kept bytes copied to a new file
renamed over the old one: :func:`replace_file`), leaving the pinned inode as it was until its
last map goes. Growth, appends past the pinned bytes, renames and unlinks need no check: a map of
an unlinked file stays valid. The exclusive lock is held while the in-place change runs, so a map
pinned by another process meanwhile waits for it (:class:`PinnedMap` takes its lock first, then
maps the file as it is).

When the pin state cannot be learnt (the file cannot be opened for the check: too many open
files, ...), :func:`in_place_allowed` says no: a replacement is always safe, an in-place change
only when no map exists.

Costs: a PinnedMap costs one descriptor and one mapping; its pages are the page cache's (shared,
reclaimable), resident only as far as they are read. A replacement (:func:`replace_file`) copies
the kept prefix of the file (in the kernel where it can: ``copy_file_range``, shared extents on
file systems that reflink) under the caller's lock (the log's: appends wait for it), and needs
the prefix's size in free space until the old inode's last map goes. Thread-safety: a PinnedMap
is immutable once made; the functions may be called from any thread.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Any, Iterator

from . import _fileio
from ._native import ffi

__all__ = ["PinnedMap", "in_place_allowed", "replace_file"]

logger = logging.getLogger(__name__)

#: bytes per pread/pwrite when the kernel copy is unavailable
_CHUNK = 1 << 20


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
        finally:
            # The map holds a descriptor of its own (a dup: the same open file description,
            # which keeps the lock) and the mapping keeps the file: this one is not needed.
            ops.close(fd)
        self._ptr = ffi.from_buffer(self._mm)
        self.size = size
        #: (device, inode) of the mapped file
        self.identity = identity
        self.address = int(ffi.cast("uintptr_t", self._ptr))
        # The map (and the lock with its descriptor) goes with the last reference: no explicit
        # close, a buffer is exported.


@contextmanager
def in_place_allowed(path: str) -> Iterator[bool]:
    """For the block: True, holding the file's exclusive pin lock, when no PinnedMap of the file
    is alive (the caller may shrink or rewrite it in place); False when one is, or when that
    cannot be learnt (the file cannot be opened or locked: too many open files, ...): the caller
    must use :func:`replace_file`, safe in every case. True as well when the file does not
    exist."""
    ops = _fileio.ops
    try:
        fd = ops.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield True
        return
    except OSError as exc:
        logger.warning("%s: cannot learn whether Arrow views pin it (%s); replacing it instead of "
                       "changing it in place", path, exc)
        yield False
        return
    try:
        try:
            allowed = ops.lock(fd)
        except OSError as exc:
            logger.warning("%s: cannot learn whether Arrow views pin it (%s); replacing it instead "
                           "of changing it in place", path, exc)
            allowed = False
        yield allowed
    finally:
        ops.close(fd)


def replace_file(path: str, fd: int, keep: int, tail: Any = b"") -> int:
    """Replace ``path`` (open as ``fd``) by a new file of its first ``keep`` bytes followed by
    ``tail``, renamed over it, instead of changing it in place (its old inode stays as it was
    for the maps pinning it). Returns a read-write descriptor of the new file; ``fd`` stays open
    (the caller closes it).

    Costs: the ``keep`` bytes are copied (``copy_file_range``, in the kernel, where the file
    system has it; ``pread``/``pwrite`` where it has not or stops early) while the caller holds
    its lock (a log's appends wait), and the disk must have room for them beside the old inode,
    whose blocks are freed only when its last map goes.

    Durability: the new file and the directory are fsynced before the rename is relied on; a
    crash before the rename leaves ``path`` untouched and a ``.tmp`` file that the log's loader
    removes; any other failure removes the ``.tmp`` itself (``path`` untouched).

    Raises:
        OSError: the copy, the fsyncs or the rename failed (``path`` is as it was), or ``fd``
            holds fewer than ``keep`` bytes.
    """
    ops = _fileio.ops
    tmp = path + ".tmp"
    new = ops.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    renamed = False
    try:
        _copy_prefix(path, fd, new, keep)
        if len(tail):
            ops.pwrite(new, tail, keep)
        ops.fsync(new)
        ops.rename(tmp, path)
        renamed = True
        ops.fsync_dir(os.path.dirname(path) or ".")
    except BaseException:
        ops.close(new)
        if not renamed:
            try:
                ops.unlink(tmp)
            except OSError as exc:  # (the loader removes it at the next open)
                logger.warning("%s: cannot remove %s (%s)", path, tmp, exc)
        raise
    return new


def _copy_prefix(path: str, src: int, dst: int, keep: int) -> None:
    """Copy the first ``keep`` bytes of ``src`` to ``dst``: in the kernel while it copies,
    then (it may stop short without an error on some file systems) with pread/pwrite."""
    ops = _fileio.ops
    copied = 0
    while copied < keep:
        n = ops.copy_range(src, dst, copied, keep - copied)
        if n <= 0:
            break
        copied += n
    while copied < keep:
        data = ops.pread(src, min(keep - copied, _CHUNK), copied)
        if not data:
            raise OSError(f"{path} ended at {copied} bytes while copying {keep}")
        ops.pwrite(dst, data, copied)
        copied += len(data)
