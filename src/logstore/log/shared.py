"""The ``.shared`` file of a partition opened by several processes, and the coordination of its writers.

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

:class:`SharedCoordinator` is the part of a shared :class:`~logstore.log.log.Log` that talks to the
page: it opens the log (the first process in recovers it), takes and releases the writers' lock
around every change (adopting on entry what other processes published, publishing on exit what
this one changed), follows other processes' appends lock-free, reloads the segment layout when
its generation moved (which also makes this process reload its producer state before the
next check, see :mod:`~logstore.log.producers`), repairs it when a writer died mid-change, and
closes the log (the last process out closes it cleanly). :class:`ExclusiveHold` is what
``log.exclusive()`` returns: the Log's thread lock, then the writers' lock.

Thread-safety: not thread-safe; the owning Log serialises access with its own lock.
"""

from __future__ import annotations

import logging
import mmap
import os
from typing import Any

from .. import _fileio
from .._native import ffi, lib
from ..errors import LogLockedError, LogstoreError

__all__ = ["SharedState", "SharedCoordinator", "ExclusiveHold", "SHARED_FILE", "new_view", "new_notify_page"]

logger = logging.getLogger("logstore.log.log")

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


class SharedCoordinator:
    """``with log._w``: the writers' lock of a shared log, and everything else a Log does to
    stay in step with the other processes that have it open.

    Entering takes the flock and adopts what other processes published; leaving publishes this
    process's changes. Reentrant; used only with the Log's thread lock held. The coordinator
    reads and sets the Log's offsets (log start, recovery point, flushed offset, high
    watermark) and its segment set as published state dictates; it owns the page, the views
    and the layout generation, and hooks every change of the segment files
    (``LogSegments.on_layout_change``).
    """

    __slots__ = ("_log", "state", "_view", "_out", "generation", "_layout_changed", "_depth")

    def __init__(self, log: Any) -> None:
        self._log = log
        self.state: SharedState | None = None
        self._view = new_view()
        self._out = new_view()
        #: the generation of the segment layout this process has loaded
        self.generation = 0
        self._layout_changed = False
        self._depth = 0
        log._segments.on_layout_change = self.begin_layout_change

    # ------------------------------------------------------------------ open and close
    def open(self, lock_fd: int) -> None:
        """Open the log in multi-process mode. ``.lock`` (``lock_fd``) is held shared by
        every process that has the log open (exclusively by an exclusive opener); the writers'
        lock on ``.shared`` serialises opens and closes, so exactly one process finds itself
        alone and recovers."""
        ops = _fileio.ops
        log = self._log
        state = self.state = SharedState(log.path)
        state.acquire()
        try:
            state.map()
            if ops.lock(lock_fd):
                # Nobody else has the log open: recover it and format the page.
                generation = state.formatted_generation() + 1
                log._load()
                self.generation = generation
                state.format(self._export_view(self._out))
                self._layout_changed = False
                if not ops.lock_shared(lock_fd):  # pragma: no cover - needs a racing exclusive open
                    raise LogLockedError(f"{log.path} was opened exclusively by another process")
            else:
                if not ops.lock_shared(lock_fd):
                    raise LogLockedError(f"{log.path} is open exclusively in another process")
                self._adopt_published()
        finally:
            state.release()

    def close(self, lock_fd: int) -> None:
        """close() of a shared log: the last process out closes it as an exclusive log does
        (trim, checkpoints, clean-shutdown marker); the others fsync and leave. The caller
        releases the page and descriptors afterwards."""
        log = self._log
        state = self.state
        assert state is not None
        state.acquire()
        if log._offline is not None:
            return
        self._adopt_published()
        # Converting our shared hold of .lock to exclusive succeeds only for the last one.
        if _fileio.ops.lock(lock_fd):
            log._close_cleanly()
        else:
            segment = log._segments.active
            if segment is not None and not segment.closed and segment.next_offset > log._flushed_offset:
                segment.flush_data()
            log._segments.unlink_due(everything=True)
            log._write_checkpoints()

    def release(self) -> None:
        """Close the page (releasing the flocks this process holds on it)."""
        if self.state is not None:
            self.state.close()
            self.state = None

    # ------------------------------------------------------------------ the writers' lock
    def __enter__(self) -> "SharedCoordinator":
        if self._depth == 0:
            self._enter_writer()
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._exit_writer()

    def _enter_writer(self) -> None:
        state = self.state
        if state is None:  # closed: the caller's _check_open reports it
            return
        state.acquire()
        try:
            self._adopt_published()
        except BaseException:
            state.release()
            raise

    def _exit_writer(self) -> None:
        state = self.state
        if state is None:
            return
        log = self._log
        try:
            if log._segments.active is not None and log._offline is None:
                if self._layout_changed:
                    self.generation += 1
                out = self._export_view(self._out)
                # self._view still holds what was adopted on entry: publish only a change.
                if self._layout_changed or ffi.buffer(out)[:] != ffi.buffer(self._view)[:]:
                    state.publish(out)
                    if log._waiters.always:
                        log._waiters.notify()
                self._layout_changed = False
        finally:
            state.release()

    def begin_layout_change(self) -> None:
        """About to change the segment files (roll, delete, swap, truncate): flag it in the
        page so that if this process dies before publishing, the next writer repairs the
        layout; the publish at the end bumps the generation."""
        if self.state is not None and not self._layout_changed:
            self._layout_changed = True
            self.state.set_dirty()

    # ------------------------------------------------------------------ following the others
    def follow(self) -> None:
        """Catch up with what other processes published (lock-free unless the segment layout
        changed). Holds the log's thread lock."""
        if self.state is None or self._log._closed or self._depth:
            return  # (inside exclusive(), this process is the writer and already current)
        view = self._view
        self.state.read(view)
        if view.generation != self.generation or self.state.dirty:
            with self:  # takes the writers' lock, which reloads the layout
                pass
        else:
            self._adopt_view(view)

    def _export_view(self, view: Any) -> Any:
        """Fill ``view`` with this process's state of the log (for publishing)."""
        log = self._log
        segment = log._segments.active
        assert segment is not None
        segment.export(view)
        view.generation = self.generation
        view.log_start_offset = log._log_start_offset
        view.recovery_point = log._recovery_point
        view.flushed_offset = log._flushed_offset
        view.high_watermark = -1 if log._high_watermark is None else log._high_watermark
        return view

    def _adopt_published(self) -> None:
        """With the writers' lock held: take over the published state, reloading the segment
        layout when it changed and repairing it when a writer died in the middle of a change."""
        state = self.state
        assert state is not None
        view = self._view
        state.read(view)
        if state.dirty:
            self._repair_layout(view)
        elif view.generation != self.generation or self._log._segments.active is None:
            self._reload_layout(view)
        else:
            self._adopt_view(view)

    def _adopt_view(self, view: Any) -> None:
        log = self._log
        segment = log._segments.active
        assert segment is not None
        a = segment.appender
        if (a.next_offset != view.next_offset or a.position != view.position
                or a.partition_leader_epoch != view.partition_leader_epoch):
            segment.adopt(view)
        log._log_start_offset = view.log_start_offset
        log._recovery_point = view.recovery_point
        if log._flushed_offset != view.flushed_offset:
            log._flushed_offset = view.flushed_offset
            log._update_flush_at()
        log._high_watermark = None if view.high_watermark < 0 else view.high_watermark

    def _reload_layout(self, view: Any) -> None:
        """Another process changed the segment files: reopen what changed, keep the rest."""
        log = self._log
        log._set_active(log._segments.reload(view))
        log._producers.invalidate()  # (a truncation may hide among the changes: reload it when used)
        self.generation = view.generation
        self._adopt_view(view)

    def _repair_layout(self, view: Any) -> None:
        """A writer died while changing the segment files: reload them from disk as an open does
        (finishing or rolling back its file operations, recovering the active segment)."""
        log = self._log
        logger.warning("%s: a process died while changing the segment files; reloading them", log.path)
        log._segments.abandon_all()
        log._load(recovery_point=view.recovery_point, log_start_offset=view.log_start_offset)
        self.generation = view.generation
        self.begin_layout_change()


class ExclusiveHold:
    """``with log.exclusive()``: the Log's thread lock, then its writers' lock (for a shared
    log, this module's :class:`SharedCoordinator`). A plain object rather than a generator
    context manager: the Queue enters it for every get and ack. Reentrant; thread-safe as the
    Log's lock is."""

    __slots__ = ("_log",)

    def __init__(self, log: Any) -> None:
        self._log = log

    def __enter__(self) -> Any:
        log = self._log
        log._lock.acquire()
        try:
            log._w.__enter__()
        except BaseException:
            log._lock.release()
            raise
        try:
            log._check_open()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return log

    def __exit__(self, *exc: object) -> None:
        log = self._log
        try:
            log._w.__exit__(None, None, None)
        finally:
            log._lock.release()
