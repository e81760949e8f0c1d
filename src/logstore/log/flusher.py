"""Flusher: a partition's flush policy (flush.messages, flush.ms) and group commit of its fsyncs.

Kafka's ``flush.messages`` asks for an fsync once that many records are unflushed and
``flush.ms`` once the oldest unflushed record is that old; :meth:`Log.flush` asks for one now.
The Flusher decides when, and makes concurrent requests share one fsync: one caller at a time
(the leader) fsyncs everything appended so far; callers arriving meanwhile wait for it and return
if it covered them, else the next leader's fsync covers all of them at once. (A plain mutex
around the fsync lets the thread that just released it take it again before the waiters wake
up, which degrades to one fsync per append.)

The Flusher holds no offsets: under its Log's lock it reads what to fsync (the active segment up
to the log end) and, once the fsync returned, advances the Log's flushed offset and recovery point.

Thread-safety: thread-safe. :attr:`lock` is held for the whole of a leader's fsync; the Log's
close takes it to wait for a running fsync.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..errors import LogClosedError
from ..metrics import Histogram
from ..segment import LogSegment

__all__ = ["Flusher", "NEVER"]

logger = logging.getLogger("logstore.log.log")

#: an offset no append reaches: no flush threshold
NEVER = 2**63 - 1
#: after an fsync, the checkpoint files are rewritten when the last write is this old
CHECKPOINT_INTERVAL_S = 60.0


class Flusher:
    """The flush policy and group commit of one :class:`~logstore.log.log.Log`.

    Args:
        log: the owning log (its lock, active segment, log end, flushed offset, recovery point).
        flush_messages: fsync once this many records are unflushed (None: never for that).
        flush_ms: fsync once an unflushed record is this old (None: never for that).
        timers: False when the owner calls :meth:`due` from its own scheduler instead of
            the Flusher starting timer threads.
    """

    def __init__(self, log: Any, flush_messages: int | None, flush_ms: int | None, timers: bool = True) -> None:
        self._log = log
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
        log = self._log
        if self.every is not None and last_offset >= log._flushed_offset + self.every - 1:
            self.sync(last_offset + 1)
        elif self.ms is not None and self.timers_enabled:
            with log._lock:
                if self._timer is None and not log._closed:
                    self._schedule_timed_flush()
                log._update_flush_at()

    def due(self) -> bool:
        """True when flush_ms is set and the last fsync is at least that old."""
        return self.ms is not None and time.monotonic() - self.last_flush >= self.ms / 1000.0

    # ------------------------------------------------------------------ group commit
    def flush(self) -> None:
        """:meth:`Log.flush`: make everything appended so far durable."""
        log = self._log
        with log._lock:
            log._check_open()
            log._follow()
            end = log._appender.next_offset
        self.sync(end)

    def sync(self, end_offset: int) -> None:
        """Make offsets below ``end_offset`` durable (sharing an fsync with concurrent callers).

        Raises:
            LogOfflineError: the fsync failed (the log goes offline) or had failed before.
        """
        log = self._log
        cond = self._cond
        with cond:
            while True:
                if log._state is not None:
                    with log._lock:
                        log._follow()  # another process's fsync may already cover end_offset
                if log._flushed_offset >= end_offset:
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
        log = self._log
        with self.lock:
            if self._concurrent:
                # Other threads asked for fsyncs lately: let them append before this fsync
                # starts, so that it covers them too (PostgreSQL's commit_delay, adaptively).
                time.sleep(0)
            with log._lock:
                if log._closed:
                    return  # close() flushes everything itself
                log._check_open()
                segment, offset = log._segments.active, log._appender.next_offset
            # Segments before the active one were fsynced when they rolled. fdatasync is
            # enough for the data; the index files are derived and rebuilt by recovery.
            try:
                if not segment.closed:
                    started = time.monotonic()
                    segment.flush_data()
                    self.times.observe((time.monotonic() - started) * 1000.0)
            except OSError as exc:
                with log._lock:
                    log._go_offline(exc)
                raise
            if self._flushed(segment, offset):
                self.last_flush = time.monotonic()
                if self.last_flush - log._last_checkpoint >= CHECKPOINT_INTERVAL_S:
                    log._write_checkpoints()  # the recovery point moved

    def _flushed(self, segment: LogSegment, target: int) -> bool:
        """``segment`` is fsynced up to ``target``: advance the log's flushed offset and recovery
        point. False when the log was closed meanwhile."""
        log = self._log
        with log._lock, log._w:
            if log._closed:
                return False
            log._flushed_offset = max(log._flushed_offset, target)
            if target > log._recovery_point and segment is log._segments.active:
                log._recovery_point = target
            log._update_flush_at()
            return True

    # ------------------------------------------------------------------ timers
    def _schedule_timed_flush(self) -> None:
        assert self.ms is not None
        timer = threading.Timer(self.ms / 1000.0, self._timed_flush)
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _timed_flush(self) -> None:
        log = self._log
        with log._lock:
            self._timer = None
        try:
            if not log._closed:
                log.flush()
        except LogClosedError:
            pass
        except Exception:  # a background thread must not die silently
            logger.exception("%s: timed flush failed", log.path)

    def cancel(self) -> None:
        """Stop the flush_ms timer (the log is closing)."""
        if self._timer is not None:
            self._timer.cancel()
