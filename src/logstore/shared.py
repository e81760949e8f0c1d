"""The ``.shared`` file: a partition's state as published to every process that has it open.

When several processes open one log (``Log.open(path, shared=True)``, which LogStore does), each
maps the partition's ``.shared`` file. It holds one page (``LS_SHARED_SIZE`` bytes, layout in
``_native/shared.c``, never read by another program) with:

* the last published view of the log (``ls_shared_view``): active segment, the appender's state,
  log start, recovery point, fsynced offset, high watermark, and a layout *generation* that every
  change of the segment files (roll, deletion, compaction swap, truncation) bumps;
* a *dirty* flag, set while a writer changes the layout and cleared by the publish that ends it;
* a notification counter (a futex word) that long-polling readers sleep on.

The file's flock is the writers' lock: a process holds it exclusively while it appends or changes
the layout, then publishes. Readers take lock-free snapshots. The state is rebuilt from the
segment files by the first process that opens the log, so nothing in this file needs to survive
a crash: it is never fsynced.

Thread-safety: not thread-safe; the owning Log serialises access with its own lock.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

from . import _fileio
from ._native import ffi, lib
from .errors import LogstoreError

__all__ = ["SharedState", "SHARED_FILE", "new_view", "new_notify_page"]

SHARED_FILE = ".shared"
_SIZE = lib.LS_SHARED_SIZE


def new_view() -> Any:
    """A zeroed ``ls_shared_view`` struct."""
    return ffi.new("ls_shared_view *")


def new_notify_page() -> Any:
    """Process-private memory laid out like a shared page, for the notification counter of a log
    or store that only this process uses (malloc'd, so 8-byte aligned as the C side requires)."""
    return ffi.new("char[]", _SIZE)


class SharedState:
    """Owner of one partition's ``.shared`` file: the writers' lock and the published view."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, SHARED_FILE)
        self._fd = _fileio.ops.open(self.path, os.O_RDWR | os.O_CREAT)
        self._mm: mmap.mmap | None = None
        self.page: Any = ffi.NULL

    def acquire(self) -> None:
        """Take the writers' lock (blocks while another process holds it)."""
        _fileio.ops.lock(self._fd, blocking=True)

    def release(self) -> None:
        """Release the writers' lock."""
        _fileio.ops.unlock(self._fd)

    def map(self) -> None:
        """Map the page (growing the file to one page if needed)."""
        if self._mm is not None:
            return
        if _fileio.ops.fsize(self._fd) < _SIZE:
            _fileio.ops.ftruncate(self._fd, _SIZE)
        self._mm = _fileio.ops.mmap(self._fd, _SIZE, True)
        self.page = ffi.from_buffer(self._mm)

    def format(self, view: Any) -> None:
        """Write a fresh page publishing ``view`` (the first process to open the log does this)."""
        if lib.ls_shared_init(self.page, _SIZE, view) != lib.LS_OK:  # pragma: no cover - size is fixed
            raise LogstoreError(f"{self.path}: cannot format the shared state page")

    def formatted_generation(self) -> int:
        """The generation of the page left by earlier processes, or 0 when it is not formatted."""
        view = new_view()
        if lib.ls_shared_read(self.page, _SIZE, view) != lib.LS_OK:
            return 0
        return int(view.generation)

    def read(self, view: Any) -> None:
        """Fill ``view`` with a consistent snapshot of the published state."""
        rc = lib.ls_shared_read(self.page, _SIZE, view)
        if rc != lib.LS_OK:
            raise LogstoreError(f"{self.path} is not a logstore shared state page (error {rc}); "
                                "close every process using the log and open it again")

    def publish(self, view: Any) -> None:
        """Make ``view`` the current state and wake long-polling readers (writers' lock held)."""
        lib.ls_shared_publish(self.page, _SIZE, view)

    @property
    def dirty(self) -> bool:
        """True when a writer started changing the segment files and has not published since."""
        return bool(lib.ls_shared_dirty(self.page))

    def set_dirty(self) -> None:
        """Flag that a change of the segment files starts (cleared by the next publish)."""
        lib.ls_shared_set_dirty(self.page, 1)

    def close(self) -> None:
        """Unmap and close the file, which releases any flock this process holds on it."""
        if self.page is not ffi.NULL:
            ffi.release(self.page)
            self.page = ffi.NULL
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        if self._fd >= 0:
            _fileio.ops.close(self._fd)
            self._fd = -1
