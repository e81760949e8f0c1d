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
page: it takes and releases the writers' lock around every change (on entry the log adopts what
other processes published, on exit this process's changes are published), follows other
processes' appends lock-free, tells the log to reload its segment layout when the generation
moved or to recover it when a writer died mid-change, and at open and close says whether this
process is the first in (which recovers the log) or the last out (which closes it cleanly). The
log's side of each step is a :class:`SharedHooks` the log hands over: the coordinator never
touches the log's offsets or segments itself. :class:`ExclusiveHold` is what ``log.exclusive()``
returns: the Log's thread lock, then the writers' lock.

Thread-safety: not thread-safe; the owning Log serialises access with its own lock.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from typing import Any, Callable, ContextManager, NamedTuple

from .. import _fileio
from .._native import ffi, lib
from ..errors import LogLockedError, LogstoreError

__all__ = ["SharedState", "SharedCoordinator", "SharedHooks", "ExclusiveHold", "SHARED_FILE", "new_view", "new_notify_page"]

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

    def try_acquire(self) -> bool:
        """Take the writers' lock if no other process holds it; False (not taken) if one does."""
        return bool(_fileio.ops.lock(self._fd, blocking=False))

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


class SharedHooks(NamedTuple):
    """The log's side of keeping a shared log in step: each hook runs with the log's thread lock
    held and keeps the log's invariants itself."""

    #: True while the log has its segments loaded (an active segment)
    loaded: Callable[[], bool]
    #: True while the log has its segments loaded and is not offline (its state may be published)
    usable: Callable[[], bool]
    #: True once the log was closed (nothing to follow)
    closed: Callable[[], bool]
    #: fill an ``ls_shared_view`` with the log's state: its active segment's appender, log start,
    #: recovery point, flushed offset, high watermark (the coordinator sets the generation)
    export: Callable[[Any], None]
    #: take up a published view whose layout generation this process has loaded
    adopt: Callable[[Any], None]
    #: another process changed the segment files: reload the layout the view describes, then adopt it
    reload: Callable[[Any], None]
    #: load and recover the segments from disk as an open does; with a view, a writer died
    #: mid-change and the view's recovery point and log start replace the checkpoint files'
    recover: Callable[[Any], None]
    #: True when a published view (of the generation this process has loaded) is the log's own
    #: state: no other process appended since, so adopting it reads nothing
    same: Callable[[Any], bool]
    #: this process published a change: wake its long-polls
    published: Callable[[], None]


class SharedCoordinator:
    """``with log._w``: the writers' lock of a shared log, and the protocol by which a Log stays in
    step with the other processes that have it open.

    Entering takes the flock and has the log adopt what other processes published; leaving
    publishes this process's changes. Reentrant; used only with the Log's thread lock held. The
    coordinator owns the page, the views and the layout generation; the log's side of each step
    is a hook (:class:`SharedHooks`). :meth:`begin_layout_change` is called before every change
    of the segment files (``LogSegments.on_layout_change``).
    """

    __slots__ = ("path", "_hooks", "state", "_view", "_out", "generation", "_layout_changed", "_depth")

    def __init__(self, path: str, hooks: SharedHooks) -> None:
        self.path = path
        self._hooks = hooks
        self.state: SharedState | None = None
        self._view = new_view()
        self._out = new_view()
        #: the generation of the segment layout this process has loaded
        self.generation = 0
        self._layout_changed = False
        self._depth = 0

    # ------------------------------------------------------------------ open and close
    def open(self, lock_fd: int) -> None:
        """Open the log in multi-process mode. ``.lock`` (``lock_fd``) is held shared by
        every process that has the log open (exclusively by an exclusive opener); the writers'
        lock on ``.shared`` serialises opens and closes, so exactly one process finds itself
        alone and recovers."""
        ops = _fileio.ops
        state = self.state = SharedState(self.path)
        state.acquire()
        try:
            state.map()
            if ops.lock(lock_fd):
                # Nobody else has the log open: recover it and format the page.
                generation = state.formatted_generation() + 1
                self._hooks.recover(None)
                self.generation = generation
                state.format(self._export_view(self._out))
                self._layout_changed = False
                if not ops.lock_shared(lock_fd):  # pragma: no cover - needs a racing exclusive open
                    raise LogLockedError(f"{self.path} was opened exclusively by another process")
            else:
                if not ops.lock_shared(lock_fd):
                    raise LogLockedError(f"{self.path} is open exclusively in another process")
                self._adopt_published()
        finally:
            state.release()

    def leave(self, lock_fd: int, offline: bool) -> bool:
        """close() of a shared log: take the writers' lock (kept until :meth:`release`), adopt
        what the others published and say whether this process is the last one out (which
        closes the log as an exclusive log does: trim, checkpoints, clean-shutdown marker); the
        others fsync and leave. An ``offline`` log adopts nothing and is never the last."""
        state = self.state
        assert state is not None
        state.acquire()
        if offline:
            return False
        self._adopt_published()
        # Converting our shared hold of .lock to exclusive succeeds only for the last one.
        return bool(_fileio.ops.lock(lock_fd))

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

    def try_enter(self) -> bool:
        """Enter as ``with coordinator:`` does where that needs no wait and no read: the writers'
        lock free now, the page clean, and nothing published by another process since this one
        last wrote (see ``SharedHooks.same``). False, holding nothing, otherwise; True is left
        with ``__exit__`` as an entry is."""
        if self._depth:
            self._depth += 1
            return True
        state = self.state
        if state is None or not state.try_acquire():
            return False
        try:
            view = self._view
            state.read(view)
            if state.dirty or view.generation != self.generation or not self._hooks.loaded() \
                    or not self._hooks.same(view):
                state.release()
                return False
            self._hooks.adopt(view)
        except BaseException:
            state.release()
            raise
        self._depth = 1
        return True

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
        try:
            if self._hooks.usable():
                if self._layout_changed:
                    self.generation += 1
                out = self._export_view(self._out)
                # self._view still holds what was adopted on entry: publish only a change.
                if self._layout_changed or ffi.buffer(out)[:] != ffi.buffer(self._view)[:]:
                    state.publish(out)
                    self._hooks.published()
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
        if self.state is None or self._depth or self._hooks.closed():
            return  # (inside exclusive(), this process is the writer and already current)
        view = self._view
        self.state.read(view)
        if view.generation != self.generation or self.state.dirty:
            with self:  # takes the writers' lock, which reloads the layout
                pass
        else:
            self._hooks.adopt(view)

    def _export_view(self, view: Any) -> Any:
        """Fill ``view`` with this process's state of the log (for publishing)."""
        self._hooks.export(view)
        view.generation = self.generation
        return view

    def _adopt_published(self) -> None:
        """With the writers' lock held: take over the published state, reloading the segment
        layout when it changed and repairing it when a writer died in the middle of a change."""
        state = self.state
        assert state is not None
        view = self._view
        state.read(view)
        if state.dirty:
            logger.warning("%s: a process died while changing the segment files; reloading them", self.path)
            self._hooks.recover(view)
            self.generation = view.generation
            self.begin_layout_change()
        elif view.generation != self.generation or not self._hooks.loaded():
            self._hooks.reload(view)
            self.generation = view.generation
        else:
            self._hooks.adopt(view)


class ExclusiveHold:
    """``with log.exclusive()``: the Log's thread lock, then its writers' lock (for a shared
    log, this module's :class:`SharedCoordinator`), then the check that the log can be used. A
    plain object rather than a generator context manager: the Queue enters it for every get and
    ack. Reentrant; thread-safe as the Log's lock is. :meth:`held` tells a thread whether it is
    inside the hold (the log's flushes must then not wait for the group commit, see
    :class:`~logstore.log.flusher.Flusher`).

    Args:
        log: what entering returns.
        lock: the log's thread lock.
        writers: the log's writers' lock (a no-op context for a log only this process writes).
        check_open: raises when the log cannot be used.
    """

    __slots__ = ("_log", "_lock", "_writers", "_check_open", "_owner", "_depth")

    def __init__(self, log: Any, lock: Any, writers: ContextManager[Any], check_open: Callable[[], None]) -> None:
        self._log = log
        self._lock = lock
        self._writers = writers
        self._check_open = check_open
        #: the thread inside the hold and how deep (both changed only with the lock held)
        self._owner: int | None = None
        self._depth = 0

    def __enter__(self) -> Any:
        self._lock.acquire()
        self._hold(True)
        return self._log

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
        try:
            self._writers.__exit__(None, None, None)
        finally:
            self._lock.release()

    def try_enter(self) -> bool:
        """Enter as ``with`` does where that needs no wait: the log's lock free now (or this
        thread's), and for a shared log its writers' lock free with nothing to read first
        (:meth:`SharedCoordinator.try_enter`). False, holding nothing, otherwise; True is left
        with :meth:`__exit__`.

        Raises:
            LogClosedError, LogOfflineError: as entering does, when the log cannot be used.
        """
        return self._lock.acquire(blocking=False) and self._hold(False)

    def _hold(self, wait: bool) -> bool:
        """With the log's lock taken: the writers' lock (``wait=False``: only if that needs no
        wait), then the check that the log can be used. False, the log's lock released, when
        the writers' lock was not taken."""
        writers = self._writers
        try:
            if wait or not isinstance(writers, SharedCoordinator):
                writers.__enter__()
            elif not writers.try_enter():
                self._lock.release()
                return False
        except BaseException:
            self._lock.release()
            raise
        self._owner = threading.get_ident()
        self._depth += 1
        try:
            self._check_open()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return True

    @property
    def log(self) -> Any:
        """What entering returns (the log)."""
        return self._log

    def held(self) -> bool:
        """True when the calling thread is inside the hold (``with log.exclusive():``)."""
        return self._owner == threading.get_ident()
