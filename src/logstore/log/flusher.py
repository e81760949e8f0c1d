"""Flusher: a partition's flush policy (flush.messages, flush.ms) and group commit of its fsyncs.

Kafka's ``flush.messages`` asks for an fsync once that many records are unflushed and
``flush.ms`` once the oldest unflushed record is that old; :meth:`Log.flush` asks for one now.
The Flusher decides when, and makes concurrent requests share one fsync: one caller at a time
(the leader) fsyncs everything appended so far; callers arriving meanwhile wait for it and return
if it covered them, else the next leader's fsync covers all of them at once. (A plain mutex
around the fsync lets the thread that just released it take it again before the waiters wake
up, which degrades to one fsync per append.)

A caller that holds the log (inside ``log.exclusive()``: an append there that reaches
flush.messages, or a flush) does not join the group commit: it fsyncs at once, under the log's
lock it holds. Joining would deadlock: a leader takes the log's lock to find what to fsync and to
record it, and in a shared log every caller under the condition follows the other processes
under the log's lock, so the condition comes before the log's lock (ARCHITECTURE.md, lock
order). There is nothing to share the fsync with anyway: no other thread can append while the
caller holds the log. Its fsync may overlap a running leader's; each records what it covered.

The Flusher holds no offsets: its log hands it :class:`FlushHooks`, the steps of a flush that
only the log can take under its own lock (what to fsync, the offsets now durable, the failure
that takes it offline, the threshold of its append path, ...), and the Flusher calls them.

Thread-safety: thread-safe. :attr:`lock` is held for the whole of a leader's fsync; the Log's
close takes it, then the log's lock, to wait for a running fsync (a holder's fsync runs under
the log's lock). The timer's state is guarded by the log's lock, which the log hands over at
construction.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, NamedTuple

from ..errors import LogClosedError
from ..metrics import Histogram
from ..segment import LogSegment

__all__ = ["Flusher", "FlushHooks", "NEVER"]

logger = logging.getLogger("logstore.log.log")

#: an offset no append reaches: no flush threshold
NEVER = 2**63 - 1


class FlushHooks(NamedTuple):
    """What a :class:`Flusher` needs of its log: each hook keeps the log's invariants itself."""

    #: the offset below which the log's records are fsynced (read without the log's lock)
    flushed_offset: Callable[[], int]
    #: under the log's lock: the active segment, the log end to fsync up to and the log's
    #: truncation count then, None when the log was closed (whose close flushes everything);
    #: raises when the log cannot be used
    target: Callable[[], "tuple[LogSegment, int, int] | None"]
    #: the segment was fsynced up to the offset (read at that truncation count): advance the
    #: log's flushed offset and recovery point unless it was truncated since (False when the
    #: log was closed meanwhile)
    synced: Callable[[LogSegment, int, int], bool]
    #: an fsync failed: the log goes offline
    failed: Callable[[BaseException], None]
    #: under the log's lock: recompute the append path's flush threshold
    refresh: Callable[[], None]
    #: the log's own flush (the flush_ms timer calls it)
    flush: Callable[[], None]
    #: a shared log: adopt what other processes published (their fsyncs count), taking the
    #: log's lock; None for a log only this process writes
    follow: "Callable[[], None] | None"
    #: True when the calling thread holds the log (inside ``log.exclusive()``): its flushes
    #: fsync at once instead of joining the group commit
    held: Callable[[], bool]


class Flusher:
    """The flush policy and group commit of one :class:`~logstore.log.log.Log`.

    Args:
        path: the log's directory (for the log messages).
        lock: the log's lock, which guards the flush_ms timer's state.
        hooks: the steps of a flush only the log can take (:class:`FlushHooks`).
        flush_messages: fsync once this many records are unflushed (None: never for that).
        flush_ms: fsync once an unflushed record is this old (None: never for that).
        timers: False when the owner calls :meth:`due` from its own scheduler instead of
            the Flusher starting timer threads.
    """

    def __init__(self, path: str, lock: "threading.RLock", hooks: FlushHooks, flush_messages: int | None,
                 flush_ms: int | None, timers: bool = True) -> None:
        self._path = path
        self._log_lock = lock
        self._hooks = hooks
        self.every = flush_messages
        self.ms = flush_ms
        self.timers_enabled = timers
        #: held for the whole of an fsync by the leader (close() waits on it)
        self.lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._leader = False
        self._waiting = 0
        self._concurrent = False
        self._timer: threading.Timer | None = None
        self._cancelled = False
        #: when the last fsync finished (monotonic seconds)
        self.last_flush = time.monotonic()
        #: fsync latencies in ms
        self.times = Histogram()

    # ------------------------------------------------------------------ policy
    def threshold(self, flushed_offset: int, notify_every_append: bool) -> int:
        """The append path's flush threshold: the offset at which an append must call
        :meth:`after_append` (the whole policy folded into one comparison). -1 makes every
        append call it: to notify long-pollers, or to start the flush_ms timer."""
        if notify_every_append:
            return -1
        if self.ms is not None and self.timers_enabled and self._timer is None:
            return -1
        if self.every is not None:
            return flushed_offset + self.every - 1
        return NEVER

    def after_append(self, last_offset: int) -> None:
        """Apply the policy after an append reached the threshold (called without the log's
        lock): fsync now for flush_messages, or make sure a flush_ms timer runs."""
        hooks = self._hooks
        if self.every is not None and last_offset >= hooks.flushed_offset() + self.every - 1:
            self.sync(last_offset + 1)
        elif self.ms is not None and self.timers_enabled:
            with self._log_lock:
                if self._timer is None and not self._cancelled:
                    self._schedule_timed_flush()
                hooks.refresh()

    def due(self) -> bool:
        """True when flush_ms is set and the last fsync is at least that old."""
        return self.ms is not None and time.monotonic() - self.last_flush >= self.ms / 1000.0

    # ------------------------------------------------------------------ group commit
    def sync(self, end_offset: int) -> None:
        """Make offsets below ``end_offset`` durable (sharing an fsync with concurrent callers;
        a caller that holds the log fsyncs at once).

        Raises:
            LogOfflineError: the fsync failed (the log goes offline) or had failed before.
        """
        hooks = self._hooks
        if hooks.held():
            self._sync_holding_log(end_offset)
            return
        cond = self._cond
        with cond:
            while True:
                if hooks.follow is not None:
                    hooks.follow()  # another process's fsync may already cover end_offset
                if hooks.flushed_offset() >= end_offset:
                    return
                if not self._leader:
                    self._leader = True
                    break
                self._waiting += 1
                try:
                    cond.wait()
                finally:
                    self._waiting -= 1
        try:
            self._sync_as_leader()
        finally:
            with cond:
                self._leader = False
                self._concurrent = self._waiting > 0
                cond.notify_all()

    def _sync_as_leader(self) -> None:
        with self.lock:
            if self._concurrent:
                # Other threads asked for fsyncs lately: let them append before this fsync
                # starts, so that it covers them too (PostgreSQL's commit_delay, adaptively).
                time.sleep(0)
            with self._log_lock:
                target = self._hooks.target()
            if target is not None:  # (None: closed; close() flushes everything itself)
                self._fsync(*target)

    def _sync_holding_log(self, end_offset: int) -> None:
        """sync() by a thread that holds the log: fsync now, neither waiting for a leader nor
        taking the condition or :attr:`lock` (both come before the log's lock)."""
        hooks = self._hooks
        if hooks.flushed_offset() >= end_offset:
            return
        with self._log_lock:  # (held already: reentrant)
            target = hooks.target()
        if target is not None:
            self._fsync(*target)

    def _fsync(self, segment: LogSegment, offset: int, truncations: int) -> None:
        """fsync the active segment up to ``offset`` (read under the log's lock after
        ``truncations`` truncations) and record it."""
        hooks = self._hooks
        # Segments before the active one were fsynced when they rolled. fdatasync is
        # enough for the data; the index files are derived and rebuilt by recovery.
        try:
            if not segment.closed:
                started = time.monotonic()
                segment.flush_data()
                self.times.observe((time.monotonic() - started) * 1000.0)
        except OSError as exc:
            with self._log_lock:
                hooks.failed(exc)
            raise
        if hooks.synced(segment, offset, truncations):
            self.last_flush = time.monotonic()

    # ------------------------------------------------------------------ timers
    def _schedule_timed_flush(self) -> None:
        assert self.ms is not None
        timer = threading.Timer(self.ms / 1000.0, self._timed_flush)
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _timed_flush(self) -> None:
        with self._log_lock:
            self._timer = None
            if self._cancelled:
                return
            # While the timer was pending the append path's threshold was NEVER (flush_ms only):
            # the next append must start a timer again even if this flush finds nothing to do.
            self._hooks.refresh()
        try:
            self._hooks.flush()
        except LogClosedError:
            pass
        except Exception:  # a background thread must not die silently
            logger.exception("%s: timed flush failed", self._path)

    def cancel(self) -> None:
        """Stop the flush_ms timer for good (the log is closing; called under its lock)."""
        self._cancelled = True
        if self._timer is not None:
            self._timer.cancel()
