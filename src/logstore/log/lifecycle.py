"""Opening and closing a Log: the ``.lock`` file, loading the segments and taking up their offsets, the clean close.

Opening (:func:`open_log`) creates the partition directory and takes its ``.lock`` file: an
exclusive flock for a log one process owns, which then loads and recovers its segments
(:func:`load`, through :class:`~logstore.log.loader.LogLoader`); for a shared log the
:class:`~logstore.log.shared.SharedCoordinator` decides which process recovers. :func:`load` takes
up what recovery established: the log start, the recovery point, the active segment with the
log end, and the leader epochs, then writes the checkpoints.

Closing (:func:`close`) stops the timers, wakes the long-polls, and for an exclusive log that is
not offline trims and fsyncs every segment, writes the checkpoints, the producer state snapshot
and then the clean-shutdown marker (:func:`close_cleanly`; a shared log's last process out does the same). Every map and
descriptor is released whatever happens; :func:`abandon` only releases them, as a process that
dies would (tests).

Thread-safety: :func:`open_log` runs in the Log's constructor, before any other thread can reach
the log; :func:`close` and :func:`abandon` take the log's lock (close first waits for a running
fsync); :func:`load` and :func:`close_cleanly` run with the log's locks held.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Any

from .. import _fileio
from ..errors import LogLockedError
from .appends import CLOSED_APPENDER

__all__ = ["LOCK_FILE", "open_log", "load", "close", "close_cleanly", "abandon"]

logger = logging.getLogger("logstore.log.log")

LOCK_FILE = ".lock"


def open_log(log: Any) -> None:
    """Take the partition directory's ``.lock`` and load the log (or join a shared log)."""
    ops = _fileio.ops
    ops.makedirs_durable(log.path)
    log._lock_fd = ops.open(os.path.join(log.path, LOCK_FILE), os.O_RDWR | os.O_CREAT)
    try:
        if log._share is not None:
            log._share.open(log._lock_fd)
            log._waiters.use_page(log._share.state.page)
        elif ops.lock(log._lock_fd):
            load(log)
        else:
            raise LogLockedError(f"{log.path} is open for writing in another process")
    except BaseException:
        log._segments.abandon_all()
        if log._share is not None:
            log._share.release()
        ops.close(log._lock_fd)
        log._lock_fd = -1
        raise
    log._closed = False


def load(log: Any, recovery_point: int | None = None, log_start_offset: int | None = None) -> None:
    """Load and recover the segments (:class:`LogLoader`), then take up the offsets they give:
    the log start, the recovery point, the log end, and the leader epochs.
    ``recovery_point``/``log_start_offset`` replace the checkpoint files' values (the repair of
    a shared log whose writer died)."""
    loaded = log._loader.load(recovery_point, log_start_offset)
    if loaded.start_past_end:
        log._set_active(log._segments.replace_all(loaded.log_start_offset))
    last = log._segments.last
    if not last.active:
        last.activate()
    log._set_active(last)
    log._log_start_offset = loaded.log_start_offset
    log._recovery_point = log._flushed_offset = loaded.recovery_point
    log._update_flush_at()
    cache = log.leader_epochs = log._loader.load_leader_epochs(loaded.log_start_offset, log._appender.next_offset)
    if cache.latest_epoch >= 0:
        log._appender.partition_leader_epoch = cache.latest_epoch
    log._producers.open(log._appender.next_offset)  # (the table itself loads on first use)
    _fileio.ops.fsync_dir(log.path)
    try:
        log._write_checkpoints()
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        # A full disk: the checkpoint files stay as they were (an older recovery point only
        # makes the next open scan more), so the log still opens and can be read.
        logger.warning("%s: no space to update the checkpoint files at open: %s", log.path, exc)
    log.recovery_report = report = loaded.report
    if report.bytes_truncated:
        logger.warning("%s: recovery dropped %d bytes of invalid data", log.path, report.bytes_truncated)


def close(log: Any) -> None:
    """Log.close: flush, trim, checkpoints and the clean-shutdown marker, then release."""
    with log._flusher.lock, log._lock:
        if log._closed:
            return
        _cancel_timers(log)
        log._waiters.wake_all()
        try:
            if log._share is not None:
                log._share.close(log._lock_fd)
            elif log._offline is None:
                close_cleanly(log)
            # (offline: no clean-shutdown marker; the next open recovers from the disk)
        finally:
            _release(log)


def close_cleanly(log: Any) -> None:
    """Trim and fsync every segment, write the checkpoints and the producer state snapshot at
    the log end, then the clean-shutdown marker."""
    end = log._segments.last.next_offset
    producers = log._producers.snapshot_data(log._log_start_offset, end)  # (reads the segments)
    log._segments.close_all()
    log._recovery_point = end
    log._producers.write_snapshot(end, producers)  # every segment is fsynced: sound at the end
    try:
        log._write_checkpoints()
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        # A full disk: every segment is fsynced, only the checkpoint files are stale. No
        # clean-shutdown marker, so the next open checks the segments past the old recovery
        # point instead of trusting them.
        logger.warning("%s: no space to update the checkpoint files at close; the next open "
                       "will run recovery: %s", log.path, exc)
        return
    log._loader.write_clean_shutdown_marker()


def abandon(log: Any) -> None:
    """Drop maps and descriptors without flushing or marking a clean shutdown."""
    with log._lock:
        if log._closed:
            return
        _cancel_timers(log)
        log._waiters.wake_all()
        _release(log)


def _cancel_timers(log: Any) -> None:
    log._flusher.cancel()
    log._segments.cancel_timers()


def _release(log: Any) -> None:
    """Release every descriptor and map (segments not closed yet are abandoned)."""
    log._segments.abandon_all(closing=True)
    log._closed = True
    log._appender = CLOSED_APPENDER
    # .lock before .shared: a process opening the log waits on the writers' lock (.shared) and
    # then tries .lock; released the other way round, the last process out could still hold
    # .lock exclusively when the opener gets there, which would refuse it.
    if log._lock_fd >= 0:
        _fileio.ops.close(log._lock_fd)
        log._lock_fd = -1
    if log._share is not None and log._share.state is not None:
        log._waiters.use_private_page()
        log._share.release()
