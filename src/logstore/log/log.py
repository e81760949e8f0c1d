"""Log: one partition's public face (offsets, appends, reads, epochs, truncation, retention, compaction).

Log owns a partition directory ``<log dir>/<topic>-<partition>/``: its segment files and
producer state snapshots, the ``.lock`` file that keeps a second process from writing, the
``.kafka_cleanshutdown`` marker, and
this partition's entries in the log directory's ``recovery-point-offset-checkpoint`` and
``log-start-offset-checkpoint`` files.

Offsets: ``log_start_offset`` is the first offset that can be read, ``log_end_offset`` the next
offset to be written, ``high_watermark`` the end of what consumers may read (equal to the log end
for a log without replication), ``recovery_point`` the offset below which every byte is known to
be fsynced.

The Log owns the partition's offsets (log start, high watermark, recovery point, flushed
offset), its active segment's appender and the append paths, opening and closing (the ``.lock``
file, the clean close), the moves of its ends (truncation, DeleteRecords, retention) and the raw
reads and copies replication needs; it keeps their invariants under its one lock. It holds the
objects that own the rest, as Kafka's UnifiedLog does:
:class:`~logstore.log.segments.LogSegments` the ordered segments (roll, read lookup, truncation,
deletion with its delay), :class:`~logstore.log.loader.LogLoader` the recovery at open (it returns
what it found), :class:`~logstore.log.flusher.Flusher` the flush policy with group commit,
:class:`~logstore.log.shared.SharedCoordinator` the processes sharing the partition,
:class:`~logstore.cleaner.LogCompaction` the compaction passes,
:class:`~logstore.log.epochs.LeaderEpochCache` the leader epochs,
:class:`~logstore.log.producers.ProducerStateManager` each idempotent producer's state and the
``.snapshot`` files, :class:`~logstore.log.waiters.AppendWaiters` the long-polls and
:class:`~logstore.log.metrics.AppendMeter` what was appended since the open.

Thread-safety: every public method may be called from any thread. Appends, reads and
maintenance are serialised by one lock; fsyncs run outside it, and concurrent durable appends
share one fsync (group commit). A reader only ever sees whole batches: the active segment's size
is published after each append completes.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
import time
from contextlib import contextmanager, nullcontext
from itertools import chain
from typing import Any, ContextManager, Generator, Iterable, Iterator, Mapping, NamedTuple, Sequence

from .. import _fileio
from .._fileio import FileRegion
from .._native import check, ffi, lib
from .._native._records import RecordAppender
from ..checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    OffsetCheckpoints,
    encode_checkpoint,
)
from ..cleaner import CleanerReport, CleanerState, LogCompaction
from ..errors import (
    InvalidRecordError,
    LogClosedError,
    OffsetMovedToTieredStorageError,
    LogLockedError,
    LogOfflineError,
    LogstoreError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from ..records import compression
from ..records.batch import (
    ENTRY_HEAD_SIZE,
    BatchBuilder,
    Record,
    RecordDecoder,
    batch_headers,
    decode_batches,
    encode_headers,
    entry_extent,
    parse_header,
    validate_client_batch,
)
from ..records.batching import (
    as_bytes,
    check_available,
    check_offset,
    check_timestamp,
    codec_for,
    encode_batches,
    one_record_batch_size,
)
from ..index import AbortedBatches, AbortedTxn
from ..records.control import ControlType, end_txn_marker_record, read_marker
from ..segment import LogSegment, SegmentInfo
from .arrow import ArrowRead, arrow_module, submit, table
from .config import LogConfig
from .epochs import LeaderEpochCache
from .flusher import NEVER, Flusher, FlushHooks
from .loader import CLEAN_SHUTDOWN_FILE, LogLoader, RecoveryReport
from .metrics import AppendMeter
from .producers import ProducerStateManager, snapshot_path
from .producerstate import CompletedTxn, ProducerStateEntry, increment_sequence
from .remote import CopyableSegment, RemoteTier
from .retention import log_start_after, segments_to_delete
from .segments import ColumnsFrom, LogSegments, decode_columns_from
from .shared import ExclusiveHold, SharedCoordinator, SharedHooks
from .waiters import AppendWaiters

__all__ = ["Log", "AppendInfo", "EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP", "RecoveryReport", "CLEAN_SHUTDOWN_FILE"]

logger = logging.getLogger("logstore.log.log")

#: Kafka's ListOffsets sentinels for :meth:`Log.offset_for_timestamp`.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2

#: the file whose flock keeps a second process from opening the log for writing
LOCK_FILE = ".lock"

_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")
#: below every timestamp: the next append computes the real roll deadline
DEADLINE_UNSET = -(2**63)
#: Stands in for the appender of a closed log: the C core rejects it (no buffer), and the slow
#: path then raises LogClosedError, so the append fast path needs no closed check.
CLOSED_APPENDER = ffi.new("ls_appender *")
#: the range of an explicit timestamp the append paths take as it is
_TS_MIN, _TS_MAX = -(2**63), 2**63 - 1
#: after an fsync, the checkpoint files are rewritten when the last write is this old
CHECKPOINT_INTERVAL_S = 60.0
_DEFAULT_MAX_BYTES = 1 << 20
_ITER_CHUNK_BYTES = 256 << 10
#: bytes of remote batches an Arrow read fetches at a time (one ranged get each)
_REMOTE_ARROW_BYTES = 4 << 20
_append_record = lib.ls_appender_append_record
#: where the core's ls_appender_append_record is, for the RecordAppender of the fast path
_APPEND_RECORD_ADDRESS = int(ffi.cast("uintptr_t", ffi.addressof(lib, "ls_appender_append_record")))
_NULL = ffi.NULL
_time_ns = time.time_ns
_NO_WRITER = nullcontext()
#: a COMMIT or ABORT marker: a control batch that is also transactional
_MARKER_BITS = lib.LS_ATTR_CONTROL | lib.LS_ATTR_TRANSACTIONAL
#: the split limit of a batch held to no max_message_bytes (a control batch)
_ANY_SIZE = 1 << 62


def _partition_key(path: str) -> tuple[str, int]:
    name = os.path.basename(os.path.normpath(path))
    if any(c.isspace() for c in name) or not name:
        raise ValueError(f"log directory name {name!r} must be non-empty and contain no whitespace")
    m = _PARTITION_DIR.match(name)
    if m:
        return m.group(1), int(m.group(2))
    # Not Kafka's <topic>-<partition> form: still usable, keyed with partition -1.
    return name, -1


class _HeldIfFree:
    """Log.exclusive_if_free's context: an ExclusiveHold entered only where that needs no wait."""

    __slots__ = ("_hold", "_held")

    def __init__(self, hold: ExclusiveHold) -> None:
        self._hold = hold
        self._held = False

    def __enter__(self) -> Any:
        self._held = self._hold.try_enter()
        return self._hold.log if self._held else None

    def __exit__(self, *exc: object) -> None:
        if self._held:
            self._held = False
            self._hold.__exit__(None, None, None)


class AppendInfo(NamedTuple):
    """What :meth:`Log.append_idempotent <logstore.log.log.Log.append_idempotent>` did with a
    client's batch: the offsets its records have, and whether it was a duplicate (a retry of a
    batch already in the log, which was not appended again: the offsets are that batch's)."""

    first_offset: int
    last_offset: int
    duplicate: bool

def _record_appender(appender: Any) -> RecordAppender:
    """The fast path's call into ``ls_appender_append_record`` through ``appender`` (kept alive
    by it): ``(timestamp, key, value) -> offset or LS_ERR_ code``, one CPython call."""
    return RecordAppender(appender, int(ffi.cast("uintptr_t", appender)), _APPEND_RECORD_ADDRESS)


def _append_settings(config: Any, shared: bool) -> tuple[int, int, int | None, bool, bool]:
    """What the append paths take from ``config``: (timestamp type code, record attributes, the
    codec the log forces or None for the producer's, keys required, plain). Plain appends take
    Log.append's fast path: no codec to apply, CreateTime stamps, keys optional, one process."""
    ts_type = config.timestamp_type_code
    codec = config.compression_type
    forced = None if codec == "producer" else compression.codec_from_name(codec)
    if forced is not None:
        check_available(forced)
    keys_required = config.compacted
    plain = forced in (None, compression.NONE) and not ts_type and not keys_required and not shared
    return ts_type, lib.LS_ATTR_TIMESTAMP_TYPE if ts_type else 0, forced, keys_required, plain

def _non_negative(offset: Any, what: str) -> int:
    offset = check_offset(offset)
    if offset < 0:
        raise ValueError(f"cannot {what} negative offset {offset}")
    return offset


def _pair_mid(offset: int, stop: int, rows: int) -> int:
    """Where the first chunk of a pair read on two threads ends: ``rows`` on, or for the last
    pair (less than two chunks left) half way, so that neither thread waits the other's whole
    chunk out at the end of a read."""
    if stop - offset >= 2 * rows:
        return offset + rows
    return offset + (stop - offset + 1) // 2


def _counted(part: Generator[Any, None, int], left: list[int | None]) -> Generator[Any, None, int]:
    """Yield ``part``'s record batches, counting their rows off ``left[0]`` (None: no limit);
    return what ``part`` returns."""
    while True:
        try:
            batch = next(part)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        if left[0] is not None:
            left[0] -= batch.num_rows
        yield batch


def _cut_at(fd: int, position: int, length: int, max_offset: int) -> int:
    """The bytes of the region's whole entries below ``max_offset`` (their heads read again: the
    region's batches were checked whole, so each is sound)."""
    cut = 0
    while cut + 12 <= length:
        head = _fileio.ops.pread(fd, min(ENTRY_HEAD_SIZE, length - cut), position + cut)
        if len(head) < 12:
            break
        size, last = entry_extent(head)
        if last >= max_offset:  # an entry that reaches max_offset is not taken
            break
        cut += size
    return min(cut, length)


class Log:
    """A partition's append-only log of Kafka record batches on local disk.

    Open with :meth:`Log.open` (or use it as a context manager). All methods are thread-safe.

    Durability: an append returns once its bytes are in the OS page cache (they survive a crash
    of the process). They survive a crash of the machine once fsynced: by :meth:`flush`, by the
    ``flush_messages``/``flush_ms`` policy (with ``flush_messages=1`` every append returns only
    after its fsync), or when its segment rolls.
    """

    # ------------------------------------------------------------------ opening
    def __init__(self, path: str | os.PathLike[str], config: LogConfig, *, shared: bool = False,
                 timers: bool = True, notify_page: Any = None) -> None:
        """Use :meth:`open` or :meth:`open_shared`. ``timers=False``: no timer threads for
        flush_ms and delayed file deletion; the owner calls :meth:`run_due_tasks` instead (the
        LogStore's scheduler does). ``notify_page``: the notification page long-polls sleep on
        (a store passes one page for all of its partitions)."""
        self.path = os.path.abspath(os.fspath(path))
        self.config = config
        self.topic, self.partition = _partition_key(self.path)
        self._key = (self.topic, self.partition)
        self.log_dir = os.path.dirname(self.path)
        self.shared = shared
        self._lock = threading.RLock()
        self._closed = True
        self._offline: BaseException | None = None
        self._lock_fd = -1
        self._builder = BatchBuilder()
        self._decoder = RecordDecoder()
        self._recovery_points = OffsetCheckpoints(self.log_dir, RECOVERY_POINT_CHECKPOINT)
        self._start_offsets = OffsetCheckpoints(self.log_dir, LOG_START_OFFSET_CHECKPOINT)
        self._cleaner_offsets = OffsetCheckpoints(self.log_dir, CLEANER_OFFSET_CHECKPOINT)
        self._compaction = LogCompaction(self._key, self._cleaner_offsets)
        self.leader_epochs: LeaderEpochCache | None = None
        # The partition's offsets (the active segment's appender holds the log end).
        self._log_start_offset = 0
        #: the remote segments (tiered storage), handed by the store's remote log manager
        self._remote: RemoteTier | None = None
        #: the log start came from its checkpoint (see LoadedLog.start_checkpointed)
        self._start_checkpointed = True
        self._high_watermark: int | None = None
        self._recovery_point = 0
        self._flushed_offset = 0
        #: bumped by every truncation (under the lock): an fsync whose target was read before
        #: one covers offsets that may no longer exist, and must not advance the offsets above
        self._truncations = 0
        self._last_checkpoint = 0.0
        self._segments = LogSegments.for_config(self.path, config, self._lock, timers)
        self._loader = LogLoader(self._segments, self._key, self._recovery_points, self._start_offsets)
        #: each idempotent producer's state and the .snapshot files
        self._producers = ProducerStateManager(self.path, self._segments, shared)
        self._appender: Any = CLOSED_APPENDER
        #: append()'s fast path: a record without headers through self._appender, in one C call
        self._put_record = _record_appender(CLOSED_APPENDER)
        # What the append paths take from the config; "plain" appends take append()'s fast path.
        (self._ts_type, self._record_attrs, self._forced_codec, self._keys_required,
         self._plain_appends) = _append_settings(config, shared)
        self._roll_deadline = NEVER
        hooks = FlushHooks(flushed_offset=self._get_flushed_offset, target=self._flush_target,
                           synced=self._synced, failed=self._go_offline, refresh=self._update_flush_at,
                           flush=self.flush, follow=self._follow_locked if shared else None,
                           held=self._held_by_caller)
        self._flusher = Flusher(self.path, self._lock, hooks, config.flush_messages, config.flush_ms, timers)
        #: the offset at which an append must apply the flush policy (see Flusher.threshold)
        self._flush_at = NEVER
        self._waiters = AppendWaiters(self.path, self._lock, self._update_flush_at, notify_page)
        # Multi-process mode (see shared.py): every change goes through the writers' lock.
        self._share: SharedCoordinator | None = None
        if shared:
            self._share = SharedCoordinator(self.path, SharedHooks(
                loaded=self._shared_loaded, usable=self._shared_usable, closed=self._shared_closed, export=self._export_view,
                adopt=self._adopt_view, reload=self._reload_layout, recover=self._recover_shared,
                same=self._view_is_own, published=self._published))
            self._segments.on_layout_change = self._share.begin_layout_change
        self._w: Any = self._share if shared else _NO_WRITER
        self._exclusive = ExclusiveHold(self, self._lock, self._w, self._check_open)
        self._meter = AppendMeter()  # what was appended since the open
        self.recovery_report: RecoveryReport | None = None
        #: seconds the last open spent loading and recovering the segments
        self.recovery_seconds = 0.0
        started = time.monotonic()
        self._open_files()  # the .lock file, then the segments loaded and recovered
        self.recovery_seconds = time.monotonic() - started
        self._meter.end_at_open = self._appender.next_offset

    @classmethod
    def open(cls, path: str | os.PathLike[str], config: LogConfig | Mapping[str, Any] | None = None,
             **overrides: Any) -> "Log":
        """Open (creating if needed) the log in directory ``path``, recovering it if necessary.

        Args:
            path: the partition directory, by convention ``<log dir>/<topic>-<partition>``.
            config: a :class:`LogConfig` or a mapping of its fields (or Kafka's dotted names).
            **overrides: LogConfig fields, e.g. ``segment_bytes=1 << 20``.

        Raises:
            LogLockedError: another process has this log open.
            InvalidConfigError: a bad setting.

        After an unclean shutdown only the segments from the recovery point on are scanned;
        the first invalid batch and everything after it is truncated (logged as a warning with
        the bytes dropped; also in :attr:`recovery_report`).
        """
        return cls(path, LogConfig.build(config, **overrides))

    @classmethod
    def open_shared(cls, path: str | os.PathLike[str], config: LogConfig | Mapping[str, Any] | None = None,
                    **overrides: Any) -> "Log":
        """Open the log so that other processes may open it at the same time (multi-process mode).

        Every process appends and reads; appends are serialised across processes by an flock on
        the partition's ``.shared`` file and published there, so a reader in any process sees
        each batch whole once its append returned. The first process to open the log recovers
        it; the last one to close it writes the clean-shutdown marker. All processes must use the
        same configuration. Durability as :meth:`open`; an fsync by any process counts for all.

        Raises:
            LogLockedError: another process has the log open exclusively (:meth:`open`).
        """
        return cls(path, LogConfig.build(config, **overrides), shared=True)

    def __enter__(self) -> "Log":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open_files(self) -> None:
        """Take the partition directory's ``.lock`` and load the log (or join a shared log)."""
        ops = _fileio.ops
        ops.makedirs_durable(self.path)
        self._lock_fd = ops.open(os.path.join(self.path, LOCK_FILE), os.O_RDWR | os.O_CREAT)
        try:
            if self._share is not None:
                self._share.open(self._lock_fd)
                self._waiters.use_page(self._share.state.page)
            elif ops.lock(self._lock_fd):
                self._load()
            else:
                raise LogLockedError(f"{self.path} is open for writing in another process")
        except BaseException:
            self._segments.abandon_all()
            if self._share is not None:
                self._share.release()
            ops.close(self._lock_fd)
            self._lock_fd = -1
            raise
        self._closed = False

    def _load(self, recovery_point: int | None = None, log_start_offset: int | None = None) -> None:
        """Load and recover the segments (:class:`LogLoader`), then take up the offsets they give:
        the log start, the recovery point, the log end, and the leader epochs.
        ``recovery_point``/``log_start_offset`` replace the checkpoint files' values (the repair of
        a shared log whose writer died)."""
        loaded = self._loader.load(recovery_point, log_start_offset,
                                   start_below_segments=self.config.remote_storage_enable)
        if loaded.start_past_end:
            self._set_active(self._segments.replace_all(loaded.log_start_offset))
        last = self._segments.last
        if not last.active:
            last.activate()
        self._set_active(last)
        self._log_start_offset = loaded.log_start_offset
        self._start_checkpointed = loaded.start_checkpointed
        self._recovery_point = self._flushed_offset = loaded.recovery_point
        self._update_flush_at()
        cache = self.leader_epochs = self._loader.load_leader_epochs(loaded.log_start_offset, self._appender.next_offset)
        if cache.latest_epoch >= 0:
            self._appender.partition_leader_epoch = cache.latest_epoch
        self._producers.open(self._appender.next_offset)  # (the table itself loads on first use)
        if loaded.txn_rebuild_from is not None:
            self._producers.rebuild_txn_indexes(loaded.txn_rebuild_from, self._log_start_offset,
                                                self._appender.next_offset)
        _fileio.ops.fsync_dir(self.path)
        try:
            self._write_checkpoints()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            # A full disk: the checkpoint files stay as they were (an older recovery point only
            # makes the next open scan more), so the log still opens and can be read.
            logger.warning("%s: no space to update the checkpoint files at open: %s", self.path, exc)
        self.recovery_report = report = loaded.report
        if report.bytes_truncated:
            logger.warning("%s: recovery dropped %d bytes of invalid data", self.path, report.bytes_truncated)

    # ------------------------------------------------------------------ multi-process mode
    def _follow(self) -> None:
        """Catch up with what other processes published (holds the lock; no-op unless shared)."""
        if self._share is not None:
            self._share.follow()

    def _begin_layout_change(self) -> None:
        """About to change the segment files: a shared log flags it in its page (shared.py)."""
        if self._share is not None:
            self._share.begin_layout_change()

    def _shared_loaded(self) -> bool:
        return self._segments.active is not None

    def _shared_usable(self) -> bool:
        return self._segments.active is not None and self._offline is None

    def _shared_closed(self) -> bool:
        return self._closed

    def _export_view(self, view: Any) -> None:
        """Fill a shared page's view with this process's state of the log (to publish it)."""
        segment = self._segments.active
        assert segment is not None
        segment.export(view)
        view.log_start_offset = self._log_start_offset
        view.recovery_point = self._recovery_point
        view.flushed_offset = self._flushed_offset
        view.high_watermark = -1 if self._high_watermark is None else self._high_watermark

    def _view_is_own(self, view: Any) -> bool:
        """Is a published view (of the loaded layout) this process's own state of the active
        segment (no other process appended since: adopting it remaps and reads nothing)?"""
        a = self._segments.active.appender
        return (a.next_offset == view.next_offset and a.position == view.position
                and a.partition_leader_epoch == view.partition_leader_epoch)

    def _adopt_view(self, view: Any) -> None:
        """Take up what another process published (the same segment layout)."""
        segment = self._segments.active
        assert segment is not None
        a = segment.appender
        if (a.next_offset != view.next_offset or a.position != view.position
                or a.partition_leader_epoch != view.partition_leader_epoch):
            segment.adopt(view)
        self._log_start_offset = view.log_start_offset
        self._recovery_point = view.recovery_point
        if self._flushed_offset != view.flushed_offset:
            self._flushed_offset = view.flushed_offset
            self._update_flush_at()
        self._high_watermark = None if view.high_watermark < 0 else view.high_watermark

    def _reload_layout(self, view: Any) -> None:
        """Another process changed the segment files: reopen what changed, keep the rest."""
        self._truncations += 1  # (it may have truncated the log: see _synced)
        self._set_active(self._segments.reload(view))
        for segment in self._segments.values():  # (an abort indexed before another process's roll)
            segment.txn_index.refresh()
        self._producers.invalidate()  # (a truncation may hide among the changes: reload it when used)
        self._adopt_view(view)

    def _recover_shared(self, view: Any) -> None:
        """Load the log as an open does: the first process in (``view`` None), or after a writer
        died while changing the segment files (its view's offsets replace the checkpoints')."""
        if view is None:
            self._load()
            return
        self._segments.abandon_all()
        self._load(recovery_point=view.recovery_point, log_start_offset=view.log_start_offset)

    def _published(self) -> None:
        if self._waiters.always:
            self._waiters.notify()

    def _leave_shared(self) -> None:
        """close() of a shared log that other processes still have open: fsync what is unflushed,
        unlink what waits to be deleted, write the checkpoints (the last one out closes it)."""
        segment = self._segments.active
        if segment is not None and not segment.closed and segment.next_offset > self._flushed_offset:
            segment.flush_data()
        self._segments.unlink_due(everything=True)
        self._write_checkpoints()

    def exclusive_if_free(self) -> ContextManager["Log | None"]:
        """:meth:`exclusive` for a caller that must never wait (a server's network loop):
        ``with log.exclusive_if_free() as held:`` holds the log when that needs no wait, and
        ``held`` is the log; else nothing is held and ``held`` is None. It would wait while
        another thread holds the log, or for a shared log while another process holds its
        writers' lock, or appended or changed its segments since this process last wrote (their
        state is read first). Inside the hold, the log's reads and appends wait for no other
        thread or process (they may still read the disk).

        Raises:
            LogClosedError, LogOfflineError: on entering, when the log cannot be used.
        """
        return _HeldIfFree(self._exclusive)

    def exclusive(self) -> ExclusiveHold:
        """Hold the log across several calls (``with log.exclusive():``): other threads, and for
        a shared log other processes, can neither append nor change the segments until the
        block ends. Reads and appends inside the block see each other, which makes
        read-decide-append sequences atomic (the Queue keeps its delivery state this way).
        Reentrant. Keep the block short: an append inside it that reaches ``flush_messages``,
        and a :meth:`flush`, fsync at once while the log is held (they do not wait for other
        threads' group commit, which needs the log). :meth:`close` is refused inside it.

        Raises:
            LogClosedError, LogOfflineError: on entering, when the log cannot be used.
        """
        return self._exclusive

    # ------------------------------------------------------------------ the active segment
    @property
    def _active(self) -> LogSegment | None:
        return self._segments.active

    def _set_active(self, segment: LogSegment) -> None:
        self._meter.switch(self._segments.active, segment)
        self._segments.active = segment
        self._use_appender(segment.appender)
        # The next append computes the deadline from the segment's first batch (roll_for_time).
        self._roll_deadline = DEADLINE_UNSET

    def _use_appender(self, appender: Any) -> None:
        """Append through ``appender`` (an ``ls_appender *``) from now on: both append paths."""
        put_record = _record_appender(appender)  # (first: if it raises, both paths keep the old appender)
        self._appender = appender
        self._put_record = put_record

    # ------------------------------------------------------------------ properties
    @property
    def closed(self) -> bool:
        """True once close() ran."""
        return self._closed

    @property
    def log_start_offset(self) -> int:
        """First readable offset."""
        if self._share is not None:
            with self._lock:
                self._follow()
        return self._log_start_offset

    @property
    def active_base_offset(self) -> int:
        """The base offset of the active segment (the one appends go to, its pages the most
        recently written). Thread-safe."""
        with self._lock:
            self._follow()
            return self._segments.active.base_offset

    @property
    def local_log_start_offset(self) -> int:
        """The first offset on local disk: :attr:`log_start_offset`, unless tiered storage
        moved older segments to the remote tier (then the first local segment's base)."""
        with self._lock:
            self._follow()
            return self._local_start()

    def _local_start(self) -> int:
        """Under the lock: the first offset of the local segments (never below the log start)."""
        return max(self._log_start_offset, self._segments.first.base_offset)

    def attach_remote(self, tier: RemoteTier) -> None:
        """Read the offsets below the first local segment from ``tier`` (tiered storage): the
        store's remote log manager calls it once the log is open. The log start becomes the
        remote tier's start when that is older than the first local segment (and not below
        the log start a DeleteRecords set, unless the checkpoint file had no entry for the
        log), else the first local segment's base: durable on return. Thread-safe.

        Raises:
            ValueError: the log's config does not enable remote storage.
        """
        if not self.config.remote_storage_enable:
            raise ValueError(f"{self.path}: remote.storage.enable is off; no remote tier can be attached")
        remote_start = tier.start_offset()
        with self._lock, self._w:
            self._check_open()
            local = self._segments.first.base_offset
            start = local if remote_start is None or remote_start > local else remote_start
            self._remote = tier
            # a segment's producer snapshot stays until the tier holds the segment
            self._producers.keep_after = lambda: tier.copied_through() + 1
            if self._start_checkpointed:  # (else: no checkpoint said where it starts; the tier does)
                start = max(start, self._log_start_offset)
            if start != self._log_start_offset:
                logger.info("%s: log start %d -> %d (remote tier from %s, local from %d)", self.path,
                            self._log_start_offset, start, remote_start, local)
                self._log_start_offset = start
                self._write_checkpoints()

    def segments_to_copy(self, from_offset: int) -> list[CopyableSegment]:
        """The sealed segments the remote tier may copy now, oldest first: those holding an
        offset at or above both ``from_offset`` (the next offset the tier lacks) and the log
        start (the one holding that offset too, whole: Kafka copies a segment that straddles
        it), and whose records all lie below both the high watermark and the last stable
        offset (no record a majority may still lose, no open transaction), with the paths of
        their files and their leader epochs. The files stay until the tier holds them (local
        retention waits for the copy), unless a DeleteRecords or the topic's deletion takes
        them first. Thread-safe."""
        stable = self.last_stable_offset
        with self._lock:
            self._check_open()
            self._follow()
            hw = self._high_watermark if self._high_watermark is not None else self._appender.next_offset
            ceiling = min(hw, stable, self._appender.next_offset)
            entries = self.leader_epochs.entries if self.leader_epochs is not None else []
            out = []
            for segment in self._segments.sealed():
                base, end = segment.base_offset, segment.next_offset - 1
                if end < max(from_offset, self._log_start_offset) or segment.size == 0:
                    continue
                if end >= ceiling:
                    break
                held = {}
                for i, (epoch, start) in enumerate(entries):
                    after = entries[i + 1][1] if i + 1 < len(entries) else end + 1
                    if start <= end and after > base:
                        held[epoch] = max(start, base)
                if not held:  # a log never led in an epoch (a store's own): Kafka's records need one
                    held[0] = base
                checkpoint = encode_checkpoint([(e, o) for e, o in entries if o <= end], 2, "leader-epoch-checkpoint")
                snapshot = snapshot_path(self.path, end + 1)
                out.append(CopyableSegment(
                    base, end, segment.size, segment.max_timestamp, segment.path, segment.offset_index.path,
                    segment.time_index.path, segment.txn_index.path if len(segment.txn_index) else None,
                    snapshot if _fileio.ops.exists(snapshot) else None, held, checkpoint))
            return out

    @property
    def remote_tier(self) -> RemoteTier | None:
        """The attached remote tier, None without tiered storage."""
        return self._remote

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record gets."""
        with self._lock:
            self._check_open()
            self._follow()
            return self._appender.next_offset

    @property
    def high_watermark(self) -> int:
        """End of what consumers may read; the log end offset when no replication sets it."""
        with self._lock:
            self._check_open()
            self._follow()
            hw = self._high_watermark
            end = self._appender.next_offset
            return end if hw is None else min(hw, end)

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None:
        """Set the high watermark (replication): it must lie in [log start, log end]."""
        with self._lock, self._w:
            self._check_open()
            end = self._appender.next_offset
            if not self._log_start_offset <= offset <= end:
                raise OffsetOutOfRangeError(offset, self._log_start_offset, end, "high watermark")
            self._high_watermark = offset

    @property
    def recovery_point(self) -> int:
        """Offsets below this are fsynced and are not rescanned after a crash."""
        if self._share is not None:
            with self._lock:
                self._follow()
        return self._recovery_point

    @property
    def segments(self) -> list[SegmentInfo]:
        """Read-only facts about each segment, oldest first."""
        with self._lock:
            self._check_open()
            self._follow()
            return self._segments.infos()

    @property
    def size_in_bytes(self) -> int:
        """Total bytes of batches in all segments."""
        with self._lock:
            self._follow()
            return self._segments.size_in_bytes

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self.path} is closed")
        if self._offline is not None:
            raise LogOfflineError(
                f"log {self.path} is offline after an I/O error ({self._offline}); "
                "close it and open it again to recover") from self._offline

    @contextmanager
    def _io_guard(self) -> Iterator[None]:
        """Take the log offline when an I/O error interrupts a change to its files.

        After a failed write, truncate, rename or fsync the files and the in-memory state may
        disagree (and after a failed fsync the page cache may have dropped data), so the only
        safe continuation is to stop using the log until it is reopened and recovered.
        """
        try:
            yield
        except OSError as exc:
            self._go_offline(exc)
            raise

    def _go_offline(self, exc: BaseException) -> None:
        logger.error("%s: taking the log offline after an I/O error or an interrupted change to its "
                     "files: %s", self.path, exc)
        self._offline = exc
        self._segments.points = None
        self._use_appender(CLOSED_APPENDER)
        self._roll_deadline = NEVER

    # ------------------------------------------------------------------ appends
    def append(self, value: bytes | None, key: bytes | None = None,
               headers: Iterable[tuple[str, bytes | None]] = (), timestamp: int | None = None) -> int:
        """Append one record; return its offset.

        Args:
            value: the record value, or None for a tombstone.
            key: the record key, or None.
            headers: ``(str, bytes | None)`` pairs.
            timestamp: CreateTime in ms since the epoch; now when None. With
                ``message_timestamp_type="LogAppendTime"`` the log's clock is used instead.

        Raises:
            TypeError: value/key not bytes-like or None, bad headers, non-int timestamp.
            RecordTooLargeError: the one-record batch exceeds max_message_bytes (nothing written).
            InvalidRecordError: no key in a log whose cleanup policy includes "compact".
            LogClosedError: after close().

        Durability: in the page cache on return; fsynced first when flush_messages says so.
        Thread-safe.
        """
        if (not headers and value.__class__ is bytes and (key is None or key.__class__ is bytes)
                and self._plain_appends
                and (timestamp is None or (timestamp.__class__ is int and _TS_MIN <= timestamp <= _TS_MAX))):
            # The fast path: one lock, one clock read, one C call.
            ts = _time_ns() // 1_000_000 if timestamp is None else timestamp
            lock = self._lock
            lock.acquire()  # explicit acquire/release: ~100 ns cheaper than `with` per call
            if not self._plain_appends:  # update_config changed the policy (compacted?) since the check
                lock.release()
                return self._append_general(value, key, headers, timestamp)
            try:
                if ts > self._roll_deadline:
                    self._roll_for_time(ts)
                offset = self._put_record(ts, key, value)
                if offset < 0:
                    offset = self._append_record_slow(offset, ts, key, value, _NULL, 0)
                if offset < self._flush_at:
                    return offset
            finally:
                lock.release()
            return self._after_append(offset)
        return self._append_general(value, key, headers, timestamp)

    def append_batch(self, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None,
                     headers: Sequence[Iterable[tuple[str, bytes | None]] | None] | None = None,
                     timestamps: Sequence[int] | None = None, compression: str | int | None = None,
                     producer_id: int = -1, base_sequence: int = -1, control: bool = False,
                     producer_epoch: int = 0, transactional: bool = False) -> int:
        """Append records as one RecordBatch (split only above max_message_bytes); return the first offset.

        Args:
            values: bytes or None (tombstone) per record.
            keys, headers, timestamps: per-record sequences of the same length, or None.
            compression: codec name ("none", "gzip", "snappy", "lz4", "zstd"); None for none.
                A log whose compression_type is not "producer" always uses its own codec.
            producer_id, producer_epoch, base_sequence: written into the batch header (Kafka's
                idempotent producer fields), and learnt by the producer state (not checked:
                :meth:`append_idempotent` checks a client's batch).
            control: write a control batch (metadata such as replication's leader change
                record, which reads pass over; Kafka's consumers skip such batches too).
                Transaction markers are written by :meth:`append_txn_marker` only.
            transactional: mark the batch as part of the producer's transaction (needs a
                ``producer_id``): it opens the producer's transaction if none is open, and
                read_committed readers see it only once :meth:`append_txn_marker` commits it.

        Raises:
            TypeError / ValueError: bad arguments (nothing written).
            RecordTooLargeError: one record alone exceeds max_message_bytes (nothing written).
            InvalidRecordError: a record without key in a compacted log (nothing written).

        Durability and thread-safety as :meth:`append`.
        """
        if isinstance(values, (bytes, bytearray, str)):
            raise TypeError("values must be a sequence of bytes, not a single bytes/str")
        if not isinstance(values, (list, tuple)):
            values = list(values)
        if not values:
            raise ValueError("append_batch needs at least one record")
        if self._keys_required and (keys is None or any(k is None for k in keys)):
            raise self._keyless_record_error()
        if transactional and (producer_id < 0 or control):
            raise ValueError("a transactional batch needs a producer_id and may not be a control batch "
                             "(append_txn_marker writes the markers)")
        codec = self._forced_codec
        if codec is None or control:
            codec = codec_for(None if control else compression)  # control batches: never compressed
        with self._lock, self._w:
            self._check_open()
            if self._keys_required and (keys is None or any(k is None for k in keys)):
                raise self._keyless_record_error()  # (again: update_config may have run since the check)
            if transactional and not self._producers.loaded:
                self._producers.current(self._log_start_offset, self._appender.next_offset)
            first = self._append_records_locked(values, keys, headers, timestamps, codec, producer_id,
                                                producer_epoch, base_sequence, control, transactional)
            last = self._appender.next_offset - 1
            if last < self._flush_at:
                return first
        self._after_append(last)
        return first

    def append_encoded(self, batch: bytes | bytearray | memoryview) -> int:
        """Append one record batch a client encoded (Kafka's produce path); return its first
        offset. :meth:`append_idempotent` with its answer's ``first_offset``: a retry of a
        producer's batch already in the log returns that batch's first offset, unwritten.

        Raises:
            CorruptRecordError, InvalidRecordError, RecordTooLargeError, OutOfOrderSequenceError,
                InvalidProducerEpochError: as :meth:`append_idempotent` (nothing written).
        """
        return self.append_idempotent(batch).first_offset

    def append_idempotent(self, batch: bytes | bytearray | memoryview, check_sequence: bool = True, *,
                          in_place: bool = False) -> AppendInfo:
        """Append one record batch a client encoded, once; return ``(first_offset, last_offset,
        duplicate)`` (:class:`~logstore.log.log.AppendInfo`).

        The batch is checked whole first (:func:`~logstore.records.batch.validate_client_batch`: CRC,
        every record, flags, size). A batch with a producer id is then checked against the
        producer state (:mod:`~logstore.log.producerstate`: the producer's epoch and last five
        batches) under the lock that orders appends: a retry of one of those batches (same
        producer, epoch and sequences) is a duplicate, not appended again, answered with the
        offsets that batch has and ``duplicate=True``. Otherwise the batch is stored byte for
        byte with its offsets and the leader epoch assigned (they lie outside the CRC), or, when
        the log's policy needs other bytes (a compression_type other than "producer" that
        differs from the batch's codec, LogAppendTime, or a compacted log, whose keys are
        checked), its records are encoded again keeping the producer id, epoch and sequence.

        ``check_sequence=False`` recognises duplicates and fences old epochs but accepts any
        sequence (replication's client skips the sequences of produces that were refused).

        ``in_place=True``: the caller hands ``batch`` over (a writable buffer nobody else writes
        or reads while the call runs, e.g. a request frame the server reuses afterwards): the
        offsets and leader epoch are stamped into it instead of into a copy, so the caller's
        bytes change (outside the CRC) when the batch is stored as it is. A read-only batch is
        copied whatever this says.

        Raises:
            CorruptRecordError, InvalidRecordError, RecordTooLargeError: a batch that may not be
                appended (nothing written).
            InvalidProducerEpochError: its producer has a newer epoch (Kafka's error 47).
            OutOfOrderSequenceError: its first sequence does not follow the producer's last
                (Kafka's error 45).

        Durability and thread-safety as :meth:`append`; the check and the append are atomic.
        """
        info = self._append_client_batch(batch, check_sequence, in_place)
        assert info is not None  # (None only for a caller that may not wait)
        return info

    def _after_append(self, last_offset: int) -> int:
        """An append reached ``_flush_at`` (called without the lock): wake long-polls, apply
        the flush policy (:meth:`Flusher.after_append`)."""
        if self._share is None and (self._waiters.count or self._waiters.always):
            self._waiters.notify()  # (a shared log's publish already notified)
        self._flusher.after_append(last_offset)
        return last_offset

    def update_config(self, config: LogConfig) -> None:
        """Apply a changed topic config to the open log at once (Kafka's ``UnifiedLog.updateConfig``).

        Retention, cleanup policy, flush policy, timestamp type, compression, max.message.bytes
        and segment.ms hold from the next call that reads them; segment.bytes and
        max.message.bytes bind the active segment at once (an append past the new size rolls);
        the index settings and preallocate apply to the segments created from now on.
        Nothing is written: the topic's metadata file is the config's durable home
        (:meth:`LogStore.alter_topic_config`). Thread-safe.

        Raises:
            LogClosedError: the log is closed.
        """
        if not isinstance(config, LogConfig):
            raise TypeError(f"config must be a LogConfig, got {type(config).__name__}")
        with self._lock:
            self._check_open()
            settings = _append_settings(config, self.shared)
            self.config = config
            (self._ts_type, self._record_attrs, self._forced_codec, self._keys_required,
             self._plain_appends) = settings
            self._segments.configure(config)
            self._flusher.every = config.flush_messages
            self._flusher.ms = config.flush_ms
            self._update_flush_at()
            # The next append computes the roll deadline from the active segment's first batch
            # with the new segment.ms.
            self._roll_deadline = DEADLINE_UNSET

    def _update_flush_at(self) -> None:
        """Recompute the append path's flush threshold (holds the lock)."""
        waiters = self._waiters
        self._flush_at = self._flusher.threshold(
            self._flushed_offset, bool(waiters.count) or (waiters.always and self._share is None))

    def _keyless_record_error(self) -> InvalidRecordError:
        """The error for a record without a key in a compacted log (nothing is written)."""
        return InvalidRecordError(f"{self.path}: a compacted log (cleanup_policy={self.config.cleanup_policy!r}) "
                                  "does not accept records without a key")

    def _append_general(self, value: Any, key: Any, headers: Any, timestamp: Any) -> int:
        """Log.append for everything off its fast path: conversions, headers, timestamps, codecs."""
        if key is None and self._keys_required:
            raise self._keyless_record_error()
        if value is not None and value.__class__ is not bytes:
            value = as_bytes(value, "value")
        if key is not None and key.__class__ is not bytes:
            key = as_bytes(key, "key")
        hbytes, hcount = encode_headers(headers) if headers else (_NULL, 0)
        if timestamp is None or self._ts_type:
            ts = _time_ns() // 1_000_000
        elif timestamp.__class__ is int and _TS_MIN <= timestamp <= _TS_MAX:
            ts = timestamp
        else:
            ts = check_timestamp(timestamp)
        if self._forced_codec:
            return self.append_batch([value], [key], [list(headers)] if headers else None, [ts])
        with self._lock, self._w:
            if key is None and self._keys_required:  # (again: update_config may have run since)
                raise self._keyless_record_error()
            if ts > self._roll_deadline:
                self._roll_for_time(ts)
            offset = _append_record(
                self._appender, ts, self._record_attrs,
                _NULL if key is None else key, -1 if key is None else len(key),
                _NULL if value is None else value, -1 if value is None else len(value),
                hbytes, 0 if hcount == 0 else len(hbytes), hcount,
            )
            if offset < 0:
                offset = self._append_record_slow(offset, ts, key, value, hbytes, hcount)
            if offset < self._flush_at:
                return offset
        return self._after_append(offset)

    def _append_records_locked(self, values: Any, keys: Any, headers: Any, timestamps: Any, codec: int,
                               producer_id: int = -1, producer_epoch: int = 0, base_sequence: int = -1,
                               control: bool = False, transactional: bool = False,
                               marker: tuple[int, int] | None = None) -> int:
        """Log.append_batch's work under the log's locks: encode the records (as several batches
        above max_message_bytes), append them, teach the producer state each batch of a producer
        (``marker``: the batch is a transaction marker of this control type and coordinator epoch);
        return the first offset."""
        # A control batch is the server's own (a leader change, a transaction marker): Kafka holds
        # only clients' batches to max.message.bytes, and a small one must never stop a partition
        # from getting a leader or a transaction from ending.
        batches = encode_batches(self._builder, values, keys, headers, timestamps,
                                 limit=_ANY_SIZE if control else self.config.max_message_bytes, codec=codec,
                                 level=self.config.level_for(codec), timestamp_type=self._ts_type,
                                 log_append_time=_time_ns() // 1_000_000 if self._ts_type else None,
                                 producer_id=producer_id, base_sequence=base_sequence, control=control,
                                 producer_epoch=producer_epoch, transactional=transactional)
        first = -1
        for batch, max_ts in batches:
            offset = self._append_encoded_locked(batch, max_ts, any_size=control)
            if first < 0:
                first = offset
            if producer_id >= 0 and self._producers.loaded:
                self._index_completed(self._producers.learn(producer_id, parse_header(batch), offset, marker))
        return first

    def _index_completed(self, completed: tuple[CompletedTxn, int] | None) -> None:
        """A marker just appended completed a transaction: an aborted one goes into the
        transaction index of the active segment, which holds the marker (holds the lock)."""
        if completed is not None and completed[0].aborted:
            txn, stable = completed
            self._active.txn_index.append(AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset, stable))

    def append_txn_marker(self, producer_id: int, producer_epoch: int, commit: bool,
                          coordinator_epoch: int = 0, timestamp: int | None = None) -> int:
        """Write a transaction marker: COMMIT (``commit``) or ABORT of the producer's open
        transaction in this partition (a control batch with Kafka's EndTxnMarker record, written
        by the transaction coordinator's side, never by a client). Returns the marker's offset.

        The transaction's records become visible to read_committed readers (commit) or are
        skipped by them for good (abort: the transaction goes into the segment's ``.txnindex``),
        once the high watermark passes the marker. A marker for a producer with no open
        transaction is written all the same (Kafka does: a retried marker, or a transaction
        that wrote nothing here).

        Raises:
            InvalidProducerEpochError: ``producer_epoch`` is older than the producer's.
            TransactionCoordinatorFencedError: ``coordinator_epoch`` is older than the one of the
                producer's last marker.

        Durability and thread-safety as :meth:`append`.
        """
        if producer_id < 0 or not 0 <= producer_epoch <= 32767:
            raise ValueError(f"a transaction marker needs a producer id and epoch, not {producer_id}/{producer_epoch}")
        key, value = end_txn_marker_record(commit, coordinator_epoch)
        kind = ControlType.COMMIT if commit else ControlType.ABORT
        with self._lock, self._w:
            self._check_open()
            table = self._producers.current(self._log_start_offset, self._appender.next_offset)
            table.check_marker(producer_id, producer_epoch, coordinator_epoch, self.path)
            first = self._append_records_locked([value], [key], None, None if timestamp is None else [timestamp],
                                                compression.NONE, producer_id, producer_epoch, -1, True, True,
                                                (kind, coordinator_epoch))
            last = self._appender.next_offset - 1
            if last < self._flush_at:
                return first
        self._after_append(last)
        return first

    @property
    def last_stable_offset(self) -> int:
        """The last stable offset (LSO): read_committed readers read below it. It is the first
        offset of the earliest transaction still open (or whose marker is not yet below the high
        watermark), else the high watermark. The first use loads the producer state. Thread-safe."""
        with self._lock:  # (no writers' lock: it reads what the other processes published)
            self._check_open()
            self._follow()
            return self._last_stable_offset_locked()

    def _last_stable_offset_locked(self) -> int:
        end = self._appender.next_offset
        hw = end if self._high_watermark is None else min(self._high_watermark, end)
        return self._producers.last_stable_offset(self._log_start_offset, end, hw)

    def aborted_transactions(self, start: int, upper: int) -> list[AbortedTxn]:
        """The aborted transactions that overlap the offsets [start, upper) (from the segments'
        ``.txnindex`` files, Kafka's collectAbortedTransactions): a read_committed reader of that
        range drops every transactional batch of an entry's producer between the entry's first
        and last offset. Thread-safe."""
        with self._lock:
            self._check_open()
            self._follow()
            if upper <= start:
                return []
            local = self._segments.aborted_transactions(start, upper)
            first = self._segments.first.base_offset
            if start >= first or self._remote is None:
                return local
            remote = self._remote
        # Below the local segments: the remote segments' transaction indexes too, searched past
        # the boundary (an entry lives with its marker, which may be local; each is listed once).
        found = remote.aborted_transactions(start, upper) + local
        return sorted(set(found), key=lambda t: (t.first_offset, t.last_offset, t.producer_id))

    def producer_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of each transaction open in this log (Kafka's
        DescribeProducers' currentTxnStartOffset). Loads the producer state on first use.
        Thread-safe."""
        with self._lock, self._w:
            self._check_open()
            return self._producers.current(self._log_start_offset, self._appender.next_offset).ongoing()

    def try_append_idempotent(self, batch: bytes | bytearray | memoryview, *,
                              in_place: bool = False) -> AppendInfo | None:
        """:meth:`append_idempotent` for a caller that must never wait (a server's network loop):
        the same checks, errors and effects when the append can be made at once, else None with
        nothing appended and nothing changed.

        None when the append would wait for a lock or for I/O beyond the copy of the batch into
        the page cache: another thread holds the log's lock; another process holds a shared log's
        writers' lock, or appended to it or changed its segments since this one last wrote (its
        state to read); the producer state is not loaded yet (a snapshot to read); the active
        segment must roll or its map grow; a flush policy acts on the append path
        (``flush_messages``: an fsync; ``flush_ms`` with the log's own timers: scheduling one);
        or the log's policy re-encodes the batch (a compacted log, LogAppendTime, a forced
        codec). The caller then makes the
        append with :meth:`append_idempotent` where it may wait. The batch is validated (CRC,
        records) before any of this, so a bad batch raises here as there.

        Durability as :meth:`append`. Thread-safety: thread-safe; it never blocks on another
        thread (the kernel's copy of the batch may still wait for memory).
        """
        return self._append_client_batch(batch, True, in_place, wait=False)

    def _append_client_batch(self, batch: Any, check_sequence: bool = True, in_place: bool = False,
                             wait: bool = True) -> AppendInfo | None:
        """Log.append_idempotent (and, ``wait=False``, try_append_idempotent: None where it would
        wait): validate a client's batch whole; for a producer's batch, check it against the
        producer state (a duplicate is answered with its offsets, nothing appended); store its
        bytes with the offsets and leader epoch assigned (re-encoded when the log's policy needs
        other bytes) and teach the producer state the batch, all under the log's locks."""
        header = validate_client_batch(batch, self.config.max_message_bytes)
        forced = self._forced_codec
        records = data = None
        if self._keys_required or self._ts_type or (forced is not None and forced != header.compression):
            if not wait:
                return None
            # The log's policy changes the bytes: the records are encoded again (keeping the
            # producer id, epoch and sequence), decoded here, outside the locks.
            records = decode_batches(batch)
            if self._keys_required and any(r.key is None for r in records):
                raise self._keyless_record_error()
        elif in_place and (batch.__class__ is bytearray or (
                isinstance(batch, memoryview) and not batch.readonly and batch.c_contiguous)):
            data = batch if batch.__class__ is bytearray else batch.cast("B")  # the caller's, stamped in place
        else:
            data = bytearray(batch)  # stamped in place with the offsets and epoch
        pid = header.producer_id
        transactional = bool(header.attributes & lib.LS_ATTR_TRANSACTIONAL)
        if wait:
            self._lock.acquire()
        elif not self._lock.acquire(blocking=False):
            return None
        try:
            if wait or self._share is None:
                self._w.__enter__()
            elif not self._share.try_enter():  # another process writes, or the layout must be read
                return None
            try:
                self._check_open()
                if not wait and not self._appends_at_once(pid, header.max_timestamp):
                    return None
                if records is None and self._keys_required and any(r.key is None for r in decode_batches(batch)):
                    # update_config made the log compacted since the check above (rare: decoded here)
                    raise self._keyless_record_error()
                if pid >= 0:
                    table = self._producers.current(self._log_start_offset, self._appender.next_offset)
                    last_sequence = increment_sequence(header.base_sequence, header.last_offset_delta)
                    known = table.check(pid, header.producer_epoch, header.base_sequence, last_sequence,
                                        check_sequence, self.path, transactional)
                    if known is not None:
                        return AppendInfo(known.first_offset, known.last_offset, True)
                if records is None:
                    first = self._append_encoded_locked(data, header.max_timestamp, may_wait=wait)
                    if first == lib.LS_ERR_FULL:  # (not wait) a roll or a map growth is due: nothing appended
                        return None
                    if pid >= 0:
                        self._producers.learn(pid, header, first)
                    else:
                        self._producers.passed(first, self._appender.next_offset)
                else:
                    first = self._append_records_locked(
                        [r.value for r in records], [r.key for r in records], [r.headers for r in records],
                        [r.timestamp for r in records], header.compression if forced is None else forced,
                        pid, header.producer_epoch, header.base_sequence if pid >= 0 else -1,
                        transactional=transactional)
                last = self._appender.next_offset - 1
                if last < self._flush_at:
                    return AppendInfo(first, last, False)
            finally:
                self._w.__exit__(None, None, None)
        finally:
            self._lock.release()
        self._after_append(last)
        return AppendInfo(first, last, False)

    def _appends_at_once(self, producer_id: int, max_timestamp: int) -> bool:
        """May an append of a batch (of ``producer_id``, up to ``max_timestamp``) be made without
        waiting (see try_append_idempotent)? Holds the lock; the segment's room is found by the
        append itself."""
        flusher = self._flusher
        if flusher.every is not None or (flusher.ms is not None and flusher.timers_enabled):
            return False  # (an fsync, or the flush_ms timer's scheduling, on the append path)
        if producer_id >= 0 and not self._producers.current_at(self._appender.next_offset):
            return False
        if max_timestamp <= self._roll_deadline:
            return True
        # An unset deadline is set by the append when the segment is empty (from the batch);
        # else from the segment's first batch, a read.
        return self._roll_deadline == DEADLINE_UNSET and self._segments.active.size == 0

    def _append_encoded_locked(self, batch: Any, max_timestamp: int, any_size: bool = False,
                               may_wait: bool = True) -> int:
        """Append one encoded batch to the active segment (rolling for time or room first);
        return its base offset. ``any_size``: not held to max_message_bytes (a control batch).
        ``may_wait=False``: LS_ERR_FULL, nothing appended, where a roll or a growth of the
        segment's map is due (the caller checked the roll deadline)."""
        if max_timestamp > self._roll_deadline:
            self._roll_for_time(max_timestamp)
        offset = self._active.append_batch(batch, any_size, remap=may_wait)
        if offset == lib.LS_ERR_FULL:
            if not may_wait:
                return offset
            self._make_room(len(batch))
            if self._roll_deadline == DEADLINE_UNSET and self._active.size == 0:
                # rolled: the deadline follows from this batch, the new segment's first (as the
                # next append would find it), so that no later append must read it back
                self._roll_deadline = self._deadline_after(max_timestamp)
            offset = self._active.append_batch(batch, any_size)
        if offset < 0:
            check(offset, self._active.path, size=len(batch), limit=self.config.max_message_bytes)
        return offset

    def _append_record_slow(self, rc: int, ts: int, key: bytes | None, value: bytes | None,
                           hbytes: Any, hcount: int) -> int:
        """Handle FULL (roll or grow, then retry) and TOO_LARGE for the single-record path."""
        self._check_open()
        hlen = 0 if hcount == 0 else len(hbytes)
        needed = (lib.LS_BATCH_HEADER_SIZE + lib.LS_RECORD_MAX_OVERHEAD + (len(key) if key else 0)
                  + (len(value) if value else 0) + hlen)
        for _ in range(3):
            if rc == lib.LS_ERR_TOO_LARGE:
                raise RecordTooLargeError(one_record_batch_size(key, value, hlen, hcount),
                                          self.config.max_message_bytes)
            if rc != lib.LS_ERR_FULL:
                check(rc, self._active.path if self._active else None)
            self._make_room(needed)
            rc = _append_record(
                self._appender, ts, self._record_attrs,
                _NULL if key is None else key, -1 if key is None else len(key),
                _NULL if value is None else value, -1 if value is None else len(value),
                hbytes, hlen, hcount,
            )
            if rc >= 0:
                return rc
        raise AssertionError(f"append still failing after rolling ({rc})")

    def _make_room(self, needed: int) -> None:
        """The active segment reported FULL for a batch of about ``needed`` bytes: grow its map,
        or roll when it should (segment_bytes) or cannot grow."""
        segment = self._segments.active
        assert segment is not None
        with self._io_guard():
            if segment.should_roll_for(needed) or not segment.grow_for(needed):
                self._roll()

    def _deadline_after(self, first_timestamp: int) -> int:
        """Kafka's segment.ms rule: roll once a record is newer than the segment's first batch's
        max timestamp by more than segment_ms - segment_jitter_ms."""
        return min(NEVER, first_timestamp + self.config.segment_ms - self.config.segment_jitter_ms)

    def _roll_for_time(self, timestamp: int) -> None:
        """An append with ``timestamp`` passed the roll deadline, or the deadline is unset."""
        self._check_open()
        segment = self._segments.active
        assert segment is not None
        if self._roll_deadline == DEADLINE_UNSET:
            if segment.size == 0:  # the record about to be appended sets the deadline
                self._roll_deadline = self._deadline_after(timestamp)
                return
            self._roll_deadline = self._deadline_after(parse_header(segment.buffer, 0).max_timestamp)
            if timestamp <= self._roll_deadline:
                return
        self._roll()
        self._roll_deadline = self._deadline_after(timestamp)

    def _roll(self) -> None:
        """Seal (trim + fsync) the active segment and create the next one (nothing when the active
        segment is empty); everything below the new segment is durable, and the checkpoints say so
        (and a loaded producer state is written as the snapshot at the new segment's base)."""
        with self._io_guard():
            if self._segments.active.size == 0:
                self._roll_deadline = NEVER
                return
            try:
                segment = self._segments.roll(self._appender.partition_leader_epoch)
            except OSError:
                raise  # (offline by the guard)
            except BaseException as exc:  # the old segment may be sealed already, without a next one
                self._go_offline(exc)
                raise
            self._set_active(segment)
            base = segment.base_offset
            if base > self._recovery_point:
                self._recovery_point = base
                self._flushed_offset = max(self._flushed_offset, base)
            self._write_checkpoints()
            # Everything below base is fsynced: a snapshot of the producer state there is sound.
            self._producers.take_snapshot(self._log_start_offset, base)

    # ------------------------------------------------------------------ flushing
    def flush(self) -> None:
        """fsync everything appended so far and advance the recovery point.

        Durability: on return every record appended before the call survives power loss.
        Thread-safe; concurrent callers share one fsync (a caller inside :meth:`exclusive`
        fsyncs at once, holding the log).
        """
        with self._lock:
            self._check_open()
            self._follow()
            end = self._appender.next_offset
        self._flusher.sync(end)

    def _get_flushed_offset(self) -> int:
        return self._flushed_offset

    def _held_by_caller(self) -> bool:
        return self._exclusive.held()

    def _follow_locked(self) -> None:
        with self._lock:
            self._follow()

    def _flush_target(self) -> tuple[LogSegment, int, int] | None:
        """What an fsync covers now (held: the lock): the active segment up to the log end, and
        the truncation count it was read at; None once closed (close flushes everything
        itself). Segments before the active one were fsynced when they rolled."""
        if self._closed:
            return None
        self._check_open()
        segment = self._segments.active
        assert segment is not None
        return segment, self._appender.next_offset, self._truncations

    def _synced(self, segment: LogSegment, target: int, truncations: int) -> bool:
        """``segment`` is fsynced up to ``target`` (read after ``truncations`` truncations):
        advance the flushed offset and, while it is still the active segment, the recovery
        point (rewriting the checkpoint files when they are old). Nothing advances when the log
        was truncated since the target was read: the offsets below it may be gone, and those
        appended after the truncation were not covered. False when the log was closed
        meanwhile."""
        with self._lock, self._w:
            if self._closed:
                return False
            if truncations != self._truncations:
                self._update_flush_at()
                return True
            self._flushed_offset = max(self._flushed_offset, target)
            if target > self._recovery_point and segment is self._segments.active:
                self._recovery_point = target
            self._update_flush_at()
            if time.monotonic() - self._last_checkpoint >= CHECKPOINT_INTERVAL_S:
                # The recovery point moved. Written under the lock, as every change of the offsets
                # is: a truncation or DeleteRecords racing it must not see its checkpoint overwritten
                # by older offsets, and the leader epochs it trims are the lock's too.
                self._write_checkpoints()
        return True

    def run_due_tasks(self) -> bool:
        """Do what the timers of a log opened with ``timers=False`` would have done by now:
        unlink deleted segment files whose file_delete_delay_ms passed, and fsync when records
        are unflushed and the last flush is at least flush_ms old. Returns True when it
        flushed. Thread-safe."""
        with self._lock:
            if self._closed or self._offline is not None:
                return False
            if self._segments.deletes_pending:
                self._segments.unlink_due()
            if self._flusher.ms is None:
                return False
            self._follow()
            pending = self._appender.next_offset > self._flushed_offset
        if pending and self._flusher.due():
            self.flush()
            return True
        return False

    def wait_for_append(self, offset: int, timeout: float | None = None) -> bool:
        """Block until the log end offset exceeds ``offset`` (a record at ``offset`` or later
        exists) or ``timeout`` seconds pass; True when it does. Long-poll without a busy loop:
        the thread sleeps on a futex that appends (from any process, for a shared log) wake.
        Thread-safe.

        Raises:
            LogClosedError: the log is or gets closed.
        """
        def reached() -> bool:
            self._check_open()
            self._follow()
            return bool(self._appender.next_offset > offset)

        return self._waiters.wait(reached, timeout)

    def _write_checkpoints(self) -> None:
        """Write this partition's recovery point and log start into the log directory's
        checkpoint files (leader epochs wholly below the log start are dropped first)."""
        self._last_checkpoint = time.monotonic()
        if self.leader_epochs is not None:
            self.leader_epochs.truncate_from_start(self._log_start_offset)
        self._recovery_points.update({self._key: self._recovery_point})
        self._start_offsets.update({self._key: self._log_start_offset})

    # ------------------------------------------------------------------ rolling
    def roll(self) -> None:
        """Seal the active segment and start a new one at the log end offset (if non-empty)."""
        with self._lock, self._w:
            self._check_open()
            if self._active is not None and self._active.size > 0:
                self._roll()

    # ------------------------------------------------------------------ reads
    def read(self, offset: int, max_bytes: int = _DEFAULT_MAX_BYTES, max_records: int | None = None,
             max_offset: int | None = None, isolation_level: str = "read_uncommitted") -> list[Record]:
        """Read records from ``offset`` on.

        Returns the records of about ``max_bytes`` of batches (at least one whole batch when
        any is available, as Kafka's fetch does), at most ``max_records`` records, none at or
        above ``max_offset`` (default: the log end). Reading at the log end returns [].
        Control records (transaction markers, leader changes) are never returned.

        ``isolation_level="read_committed"`` reads as Kafka's read_committed consumers do: only
        below the :attr:`last_stable_offset`, and without the records of aborted transactions
        (it returns [] only when no committed record lies between ``offset`` and the LSO).

        Raises:
            OffsetOutOfRangeError: offset below log_start_offset or above log_end_offset.
            CorruptRecordError: a batch on the way fails its CRC or structure checks.

        Every batch a read takes records from is validated first, CRC included. With
        ``max_records``, only the records asked for are decoded, and a batch validated whole
        once is remembered (by position and stored CRC, per segment, while the log is open): a
        later such read of it skips the CRC, so a point read costs microseconds rather than its
        batch's CRC; reads without ``max_records`` check every batch every time.

        Thread-safe; never returns a record of a partially written batch.
        """
        if isolation_level != "read_uncommitted":
            return self._read_committed(offset, max_bytes, max_records, max_offset, isolation_level)
        if max_records == 1 and max_offset is None:
            # A point read: one call into C (the segments' PointLog) when nothing is unusual;
            # None from it sends the read down the general path below, which decides.
            lock = self._lock
            lock.acquire()  # explicit acquire/release: cheaper than `with` per call
            try:
                points = self._segments.points
                if points is None:
                    points = self._point_reader()
                record = None if points is None else points.read(offset, self._log_start_offset)
            finally:
                lock.release()
            if record is not None:
                return [record]
        if offset.__class__ is not int:
            offset = check_offset(offset)
        if max_records is not None and max_records <= 0:
            return []
        with self._lock:
            self._check_open()
            self._follow()
            end = self._appender.next_offset
            if offset < self._log_start_offset or offset > end:
                raise OffsetOutOfRangeError(offset, self._log_start_offset, end, f"read from {self.path}")
            limit = end if max_offset is None else min(max_offset, end)
            if offset >= limit:
                return []
            remote = self._remote_holding(offset, "read")
            if remote is None:
                return self._segments.read(self._decoder, offset, max_bytes, limit, max_records)
        return self._read_remote(remote, offset, max_bytes, limit, max_records)

    def _remote_holding(self, offset: int, what: str) -> RemoteTier | None:
        """Under the lock, for an ``offset`` at or above the log start: the remote tier when
        ``offset`` lies below the local segments (tiered storage), else None.

        Raises:
            OffsetMovedToTieredStorageError: it lies below them and no remote tier is attached.
        """
        first = self._segments.first.base_offset
        if offset >= first:
            return None
        if self._remote is None:
            raise OffsetMovedToTieredStorageError(offset, first, f"{what} from {self.path} (no remote tier attached)")
        return self._remote

    def _remote_raw(self, remote: RemoteTier, offset: int, max_bytes: int, what: str) -> bytes:
        """``remote.read_raw``, without the log's lock. Batches that start past ``offset`` mean
        no remote segment held it any more: when the log start moved past it meanwhile (the
        tier's expiration), that is OffsetOutOfRangeError, as Kafka's remote read says, not a
        silent skip to later records."""
        raw = remote.read_raw(offset, max_bytes)
        if raw and parse_header(raw, 0).base_offset > offset:
            with self._lock:
                if offset < self._log_start_offset:
                    raise OffsetOutOfRangeError(offset, self._log_start_offset, self._appender.next_offset,
                                                f"{what} from {self.path} (the log start moved past it)")
        return raw

    def _read_remote(self, remote: RemoteTier, offset: int, max_bytes: int, limit: int,
                     max_records: int | None) -> list[Record]:
        """Log.read below the local segments, without the log's lock: records from the remote
        batches holding ``offset`` on (the next remote segment when one holds none of them,
        the local segments once past the remote ones)."""
        decoder = RecordDecoder()
        where = f"{self.path} (remote tier)"
        while offset < limit:
            raw = self._remote_raw(remote, offset, max_bytes, "read")
            if not raw:
                break  # no remote segment holds it: the local ones take over
            records, _ = decoder.decode(raw, 0, len(raw), offset, limit, max_records, where, exact=True)
            if records and records[-1].offset >= limit:  # a batch straddling the limit comes whole
                records = [r for r in records if r.offset < limit]
            if records:
                if max_records is not None:
                    del records[max_records:]
                return records
            after = offset
            for _, header in batch_headers(raw):
                after = header.last_offset + 1
            if after <= offset:
                break
            offset = after  # only control records or records below the offset: read on
        with self._lock:
            self._check_open()
            self._follow()
            if offset < self._log_start_offset:
                raise OffsetOutOfRangeError(offset, self._log_start_offset, self._appender.next_offset,
                                            f"read from {self.path} (the log start moved past it)")
            first = self._segments.first.base_offset
        # Past what the remote tier holds: the local segments from here (a gap between the two
        # would be skipped as a compacted range is).
        return self.read(max(offset, first), max_bytes, max_records, limit) if max(offset, first) < limit else []

    def _read_committed(self, offset: int, max_bytes: int, max_records: int | None, max_offset: int | None,
                        isolation_level: str) -> list[Record]:
        """Log.read with read_committed: below the LSO, without aborted transactions' records."""
        if isolation_level != "read_committed":
            raise ValueError(f"isolation_level must be 'read_uncommitted' or 'read_committed', not {isolation_level!r}")
        stable = self.last_stable_offset
        limit = stable if max_offset is None else min(check_offset(max_offset), stable)
        if offset.__class__ is not int:
            offset = check_offset(offset)
        aborted = AbortedBatches(self.aborted_transactions(offset, limit))
        if not aborted or (max_records is not None and max_records <= 0):
            return self.read(offset, max_bytes, max_records, limit)
        with self._lock:
            self._check_open()
            self._follow()
            end = self._appender.next_offset
            if offset < self._log_start_offset or offset > end:
                raise OffsetOutOfRangeError(offset, self._log_start_offset, end, f"read from {self.path}")
        out: list[Record] = []
        for raw, batches in self._raw_chunks(offset, limit, max_bytes):
            for position, header in batches:
                if not header.attributes & lib.LS_ATTR_CONTROL and not aborted.covers(
                        header.producer_id, header.base_offset, header.attributes):
                    records, _ = self._decoder.decode(raw, position, position + header.size, offset, limit, None,
                                                      self.path)
                    out.extend(r for r in records if r.offset < limit)
            if out:
                break
        if max_records is not None:
            del out[max_records:]
        return out

    def _raw_chunks(self, offset: int, stop: int, max_bytes: int) -> Iterator[tuple[bytes, list[tuple[int, Any]]]]:
        """The whole batches from the one holding ``offset`` up to ``stop`` (exclusive), a
        chunk of about ``max_bytes`` at a time (each read under the lock, CRC-checked; from the
        remote tier without it): the chunk's bytes and its batches' (position, header). For the
        walks that must see batch headers (read_committed: producer ids and flags) rather than
        records.

        Raises:
            OffsetOutOfRangeError: the log start moved past the walk.
        """
        while offset < stop:
            with self._lock:
                self._check_readable_from(offset)
                remote = self._remote_holding(offset, "read")
                raw = self._segments.read_raw(offset, max_bytes) if remote is None else b""
            if remote is not None:
                raw = self._remote_raw(remote, offset, max_bytes, "read")
                if not raw:  # no remote segment holds it: on from the local segments
                    with self._lock:
                        self._check_readable_from(offset)
                        raw = self._segments.read_raw(max(offset, self._segments.first.base_offset), max_bytes)
            batches = []
            for position, header in batch_headers(raw):
                if header.base_offset >= stop:
                    break
                batches.append((position, header))
            if not batches:
                return
            yield raw, batches
            offset = max(offset, batches[-1][1].last_offset + 1)

    def _point_reader(self) -> Any:
        """The segments' reader of one record (made now), or None while point reads must take
        the general path: a closed, offline or shared log. Called under the lock."""
        if self._share is not None or self._closed or self._offline is not None:
            return None
        return self._segments.point_reader()

    def iter(self, start: int | None = None, end: int | None = None,
             max_bytes: int = _ITER_CHUNK_BYTES, isolation_level: str = "read_uncommitted") -> Iterator[Record]:
        """Iterate over records from ``start`` (default: log start) up to ``end`` (exclusive;
        default: the log end at the time of the call), reading ``max_bytes`` at a time.
        ``isolation_level`` as :meth:`read` (read_committed stops at the last stable offset of
        the time of the call and skips aborted transactions).

        Thread-safe; concurrent appends past ``end`` are not yielded. The default chunk is
        smaller than read()'s 1 MiB: iteration then keeps fewer Records alive at once.

        Raises:
            OffsetOutOfRangeError: ``start`` below the log start (when reading reaches it).
        """
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError(f"isolation_level must be 'read_uncommitted' or 'read_committed', not {isolation_level!r}")
        stable = self.last_stable_offset if isolation_level == "read_committed" else None
        with self._lock:
            self._check_open()
            self._follow()
            offset = self._log_start_offset if start is None else start
            stop = self._appender.next_offset if end is None else end
        if stable is not None:
            stop = min(stop, stable)
        return chain.from_iterable(self._chunks(offset, stop, max_bytes, isolation_level))

    def _chunks(self, offset: int, stop: int, max_bytes: int, isolation_level: str = "read_uncommitted"
                ) -> Iterator[list[Record]]:
        while offset < stop:
            records = self.read(offset, max_bytes=max_bytes, max_offset=stop, isolation_level=isolation_level)
            if not records:  # read() already looked through every later segment
                return
            yield records
            offset = records[-1].offset + 1

    def __iter__(self) -> Iterator[Record]:
        return self.iter()

    def iter_arrow(self, start: int | None = None, end: int | None = None, columns: Sequence[str] | None = None,
                   max_records: int | None = None, isolation_level: str = "read_uncommitted",
                   views: bool = False) -> Iterator[Any]:
        """The records from ``start`` (default: log start) up to ``end`` (exclusive; default:
        the log end at the time of the call) as ``pyarrow.RecordBatch`` es of at most about
        32,768 rows, in the Spark Kafka source's schema (see :mod:`logstore.records.arrow`):
        ``columns`` names the columns to build (default: all but ``headers``), ``max_records``
        caps the rows. Keys and values are gathered by C from the mapped segments, every batch
        CRC-checked; memory stays bounded by two record batches whatever the log's size. On
        more than one core and without ``max_records``, chunks are decoded in pairs, the second
        by a helper thread, so the records of a batch may have been read (under the log's lock,
        consistently) one chunk before it is yielded.

        ``isolation_level="read_committed"`` stops at the :attr:`last_stable_offset` and leaves
        out the records of aborted transactions (the ranges between them are read as above).

        ``views=True``: the ``key`` and ``value`` columns are ``pyarrow.binary_view()`` arrays
        whose values are not copied: those of at most 12 bytes sit in the views themselves, the
        longer ones are read in place from a read-only map of the segment file (uncompressed
        batches), from the decompressed bytes of their batch (compressed ones) or from the bytes
        fetched from the remote tier. Each record batch keeps what it points into alive: a
        table's maps of the segments it came from stay mapped (page cache, not private memory)
        and their files stay on disk, even once deleted, until the table is garbage; iterating
        without keeping the batches stays bounded as before. The bytes viewed never change:
        while a table maps a segment file, a truncation of that file (``truncate_to``, a
        replica's truncation, recovery at the next open, in this process or another) writes a
        new file and renames it over the old one instead of changing it in place, and appends,
        rolls, compaction and retention only add, rename or unlink files. The batches are
        immutable and may be read from any thread, after the log is closed too.

        Needs pyarrow (``pip install logstore[arrow]``). Thread-safe; concurrent appends past
        ``end`` are not yielded.

        Raises:
            OffsetOutOfRangeError: ``start`` below the log start or above the log end.
            ValueError: an unknown column name or isolation level.
            CorruptRecordError: a batch on the way fails its checks.
            ImportError: pyarrow is not installed.
        """
        arrowread = arrow_module()
        columns = arrowread.check_columns(columns)
        if max_records is not None and max_records < 0:
            raise ValueError(f"max_records must be >= 0, not {max_records}")
        with self._lock:
            self._check_open()
            self._follow()
            log_end = self._appender.next_offset
            offset = self._log_start_offset if start is None else check_offset(start)
            if offset < self._log_start_offset or offset > log_end:
                raise OffsetOutOfRangeError(offset, self._log_start_offset, log_end, f"read_arrow from {self.path}")
            stop = log_end if end is None else min(check_offset(end), log_end)
        reading = ArrowRead(arrowread, columns, bool(views))
        if isolation_level == "read_uncommitted":
            return self._arrow_batches(reading, offset, stop, max_records)
        if isolation_level != "read_committed":
            raise ValueError(f"isolation_level must be 'read_uncommitted' or 'read_committed', not {isolation_level!r}")
        stop = min(stop, self.last_stable_offset)
        return self._arrow_committed(reading, offset, stop, max_records)

    def _arrow_committed(self, reading: ArrowRead, offset: int, stop: int, max_records: int | None) -> Iterator[Any]:
        """iter_arrow with read_committed: the ranges between aborted batches, each as usual."""
        left = max_records
        for a, b in self.committed_ranges(offset, stop):
            for batch in self._arrow_batches(reading, a, b, left):
                if left is not None:
                    left -= batch.num_rows
                yield batch
            if left is not None and left <= 0:
                return

    def committed_ranges(self, start: int, stop: int) -> list[tuple[int, int]]:
        """The offset ranges [a, b) that cover [start, stop) but the batches of aborted
        transactions (the data of an aborted transaction's producer between its first offset
        and its marker, as the ``.txnindex`` files list them): what a read_committed reader
        reads below the LSO. One range when nothing was aborted there. Thread-safe.

        Raises:
            CorruptRecordError: a batch on the way fails its checks.
        """
        aborted = AbortedBatches(self.aborted_transactions(start, stop))
        if not aborted:
            return [(start, stop)] if start < stop else []
        out: list[tuple[int, int]] = []
        a = start
        for _, batches in self._raw_chunks(start, stop, _ITER_CHUNK_BYTES):
            for _, header in batches:
                if aborted.covers(header.producer_id, header.base_offset, header.attributes):
                    if a < header.base_offset:
                        out.append((a, header.base_offset))
                    a = header.last_offset + 1
        if a < stop:
            out.append((a, stop))
        return out

    def read_arrow(self, start: int | None = None, end: int | None = None, columns: Sequence[str] | None = None,
                   max_records: int | None = None, isolation_level: str = "read_uncommitted",
                   views: bool = False) -> Any:
        """:meth:`iter_arrow`'s record batches as one ``pyarrow.Table`` (empty with the schema
        when there are no records). Same arguments, guarantees and errors; the table holds every
        record asked for in memory (with ``views``, the long keys and values as maps of the
        segment files it read, see :meth:`iter_arrow`)."""
        return table(list(self.iter_arrow(start, end, columns, max_records, isolation_level, views)), columns, views)

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """Earliest offset whose record timestamp >= ``timestamp`` (Kafka's ListOffsets).

        Only records at or after the log start count. ``EARLIEST_TIMESTAMP`` (-2) gives the
        log start offset and ``LATEST_TIMESTAMP`` (-1) the log end offset. Returns None when no
        record is that recent. Thread-safe.
        """
        timestamp = check_timestamp(timestamp)
        with self._lock:
            self._check_open()
            self._follow()
            if timestamp == EARLIEST_TIMESTAMP:
                return self._log_start_offset
            if timestamp == LATEST_TIMESTAMP:
                return self._appender.next_offset
            remote = self._remote if self._log_start_offset < self._segments.first.base_offset else None
            if remote is None:
                return self._segments.offset_for_timestamp(self._decoder, timestamp, self._log_start_offset)
            start = self._log_start_offset
        found = remote.offset_for_timestamp(timestamp, start)  # the remote segments first, without the lock
        if found is not None:
            return found
        with self._lock:
            self._check_open()
            return self._segments.offset_for_timestamp(self._decoder, timestamp, self._log_start_offset)

    def _arrow_batches(self, reading: ArrowRead, offset: int, stop: int, max_records: int | None) -> Iterator[Any]:
        """iter_arrow's batches of [offset, stop): from the remote tier below the local segments,
        then from the local ones; a part whose local segments leave the disk meanwhile (local
        retention) is read from the tier again, and one the log start moved past raises."""
        left = [max_records]  # what may still be returned (None: no limit), shared with the parts
        while offset < stop and (left[0] is None or left[0] > 0):
            with self._lock:
                self._check_readable_from(offset)
                remote = self._remote_holding(offset, "read_arrow")
                first = self._segments.first.base_offset
            if remote is not None:  # below the local segments: the remote tier's batches
                part = self._arrow_remote(reading, remote, offset, min(stop, first), left[0])
            elif left[0] is None and (os.cpu_count() or 1) > 1:
                part = self._arrow_batches_in_pairs(reading, offset, stop)
            else:
                part = self._arrow_local(reading, offset, stop, left[0])
            offset = yield from _counted(part, left)

    def _arrow_local(self, reading: ArrowRead, offset: int, stop: int,
                     max_records: int | None) -> Generator[Any, None, int]:
        """iter_arrow's batches from the local segments, a chunk at a time under the lock;
        returns the offset it stopped at (``stop``, or one local retention took meanwhile)."""
        arrowread = reading.module
        decoder = RecordDecoder(capacity=arrowread.ROWS_PER_BATCH, views=reading.views)
        builder = reading.builder(self, offset, stop, max_records, decoder)
        while offset < stop and not builder.done:
            with self._lock:
                self._check_readable_from(offset)
                if offset < self._segments.first.base_offset:
                    break  # gone from the local disk: the caller reads it from the remote tier
                limit = min(stop, offset + arrowread.ROWS_PER_BATCH)
                self._pin_views(reading, offset, limit, builder)
                offset = max(self._segments.decode_columns(decoder, offset, limit, builder.sink), builder.next_offset)
            yield from builder.take()
        yield from builder.take()
        return stop if builder.done else offset

    def _arrow_remote(self, reading: ArrowRead, remote: RemoteTier, offset: int, upto: int,
                      max_records: int | None) -> Generator[Any, None, int]:
        """iter_arrow's batches of the offsets [offset, upto) below the local segments, decoded
        by C from the remote tier's batches (fetched without the log's lock, CRC-checked);
        returns the offset it stopped at."""
        decoder = RecordDecoder(capacity=reading.module.ROWS_PER_BATCH, views=reading.views)
        builder = reading.builder(self, offset, upto, max_records, decoder)
        where = f"{self.path} (remote tier)"
        while offset < upto and not builder.done:
            raw = self._remote_raw(remote, offset, _REMOTE_ARROW_BYTES, "read_arrow")
            if not raw:  # nothing remote from here: the log start moved past it, or the local segments go on
                with self._lock:
                    self._check_readable_from(offset)
                    offset = max(offset, self._segments.first.base_offset)
                break
            after = decode_columns_from(decoder, ColumnsFrom(raw, 0, len(raw), where), offset, upto, builder.sink)
            offset = upto if after is None else max(after, builder.next_offset)
            yield from builder.take()
        yield from builder.take()
        return upto if builder.done else offset

    def _check_readable_from(self, offset: int) -> None:
        """Under the log's lock: the log is open and ``offset`` is not below its start."""
        self._check_open()
        self._follow()
        if offset < self._log_start_offset:
            raise OffsetOutOfRangeError(offset, self._log_start_offset, self._appender.next_offset,
                                        f"read_arrow from {self.path} (the log start moved past it)")

    def _pin_views(self, reading: ArrowRead, offset: int, limit: int, *builders: Any) -> None:
        """Under the log's lock, with ``views``: give the builders the pinned maps of the
        segments a decode of [offset, limit] reads (the active one's written bytes too: appends
        only add to them, and every process's truncation replaces a pinned file)."""
        if reading.views:
            maps = self._segments.view_maps(offset, limit)
            for builder in builders:
                builder.add_maps(maps)

    def _arrow_batches_in_pairs(self, reading: ArrowRead, offset: int, stop: int) -> Generator[Any, None, int]:
        """Two chunks at a time on two cores: while this thread decodes ``[offset, mid)``, the
        helper thread decodes from ``mid`` on in the segment holding it (located here first), or
        this thread does once done with its own if the helper has not started (it may get no
        core), and the log's lock is held until both are done, so nothing moves under either.
        The C decode releases the GIL. Chunk A's builder stops at ``mid``; B's takes a batch
        straddling its limit whole, as the single-chunk loop does."""
        rows = reading.module.ROWS_PER_BATCH
        decoders = (RecordDecoder(capacity=rows, views=reading.views), RecordDecoder(capacity=rows, views=reading.views))
        while offset < stop:
            with self._lock:
                self._check_readable_from(offset)
                if offset < self._segments.first.base_offset:
                    return offset  # gone from the local disk: the caller reads it from the remote tier
                mid = _pair_mid(offset, stop, rows)
                first = reading.builder(self, offset, mid, decoder=decoders[0])
                second, helper = None, None
                # Both starts are located before the helper runs: a lookup that finds a damaged
                # index entry rebuilds that segment's indexes, which unmaps its log for a moment,
                # so it must not happen while the helper reads the segment.
                self._segments.columns_from(offset)
                at = self._segments.columns_from(mid) if mid < stop else None
                if at is None:
                    self._pin_views(reading, offset, mid, first)
                else:
                    second = reading.builder(self, mid, stop, decoder=decoders[1])
                    self._pin_views(reading, offset, min(stop, mid + rows), first, second)
                    helper = submit(decoders[1], at, mid, min(stop, mid + rows), second.sink)
                try:
                    while offset < mid and not first.done:
                        offset = max(self._segments.decode_columns(decoders[0], offset, mid, first.sink), first.next_offset)
                except BaseException:
                    if helper is not None:
                        helper.cancel()  # nothing may read the segment once the lock is let go
                    raise
                after = helper.result() if helper is not None else None
                offset = mid if after is None else max(after, second.next_offset)  # type: ignore[union-attr]
            yield from first.take()
            if second is not None:
                yield from second.take()
        return offset

    def read_raw(self, offset: int, max_bytes: int = _DEFAULT_MAX_BYTES) -> bytes:
        """Whole batches, byte for byte as stored, from the one holding ``offset`` on (at least
        one batch when there is one, else about ``max_bytes``): what a fetch answers, a Kafka
        client's or a follower's. Reads stop at the log end (not the high watermark). CRCs are checked. Thread-safe.

        Raises:
            OffsetOutOfRangeError: ``offset`` outside [log start, log end].
            CorruptRecordError: a batch on the way is invalid.
        """
        with self._reading(offset, "read_raw") as start:
            remote = self._remote_holding(start, "read_raw")
            if remote is None:
                return self._segments.read_raw(start, max_bytes)
        raw = self._remote_raw(remote, start, max_bytes, "read_raw")
        if raw:
            return raw
        with self._reading(offset, "read_raw") as start:  # past the remote segments: the local ones
            return self._segments.read_raw(max(start, self._segments.first.base_offset), max_bytes)

    def read_region(self, offset: int, max_bytes: int = _DEFAULT_MAX_BYTES,
                    max_offset: int | None = None, end_offset: bool = False) -> FileRegion | None:
        """The batches :meth:`read_raw` returns, as a region of the segment file instead of
        bytes (None past the end), for a server to write with ``sendfile`` (zero copy), none at
        or above ``max_offset`` (a batch boundary, such as a replicated high watermark or the
        last stable offset). The caller owns the region and must close it (see
        :class:`logstore._fileio.FileRegion`); it stays readable if the segment is deleted
        meanwhile. With ``end_offset`` the region's ``end_offset`` is set: the offset after its
        last batch (the upper bound of :meth:`aborted_transactions` for a read_committed
        fetch). CRCs are checked. Thread-safe.

        Raises:
            OffsetOutOfRangeError, CorruptRecordError: as :meth:`read_raw`.
            OffsetMovedToTieredStorageError: ``offset`` lies below the local segments (tiered
                storage): :meth:`read_raw` reads it from the remote tier.
        """
        with self._reading(offset, "read_region") as start:
            first = self._segments.first.base_offset
            if start < first:
                raise OffsetMovedToTieredStorageError(start, first, f"read_region from {self.path}")
            segment, position, length = self._segments.locate_raw(start, max_bytes)
            if segment is None:
                return None
            if max_offset is not None and max_offset < self._appender.next_offset:
                length = _cut_at(segment.fd, position, length, max_offset)
                if not length:
                    return None
            after = -1
            if end_offset:  # the next batch's base offset, or the segment's end
                after = segment.next_offset
                if position + length + 8 <= segment.size:
                    after = int.from_bytes(_fileio.ops.pread(segment.fd, 8, position + length), "big")
            # A descriptor of its own: the segment may be closed, rolled or deleted before the
            # region is written (its pages stay readable through it).
            return FileRegion(_fileio.ops.dup(segment.fd), position, length, after)

    @contextmanager
    def _reading(self, offset: int, what: str) -> Iterator[int]:
        """Hold the log's lock for a raw read at ``offset`` (checked: within [log start, log end])."""
        offset = check_offset(offset)
        with self._lock:
            self._check_open()
            self._follow()
            end = self._appender.next_offset
            if offset < self._log_start_offset or offset > end:
                raise OffsetOutOfRangeError(offset, self._log_start_offset, end, f"{what} from {self.path}")
            yield offset

    # ------------------------------------------------------------------ leader epochs and a follower's copy
    def assign_leader_epoch(self, epoch: int) -> None:
        """Become the leader of ``epoch``: record (epoch, log end offset) in
        leader-epoch-checkpoint (fsynced) and stamp the epoch into every batch appended from now
        on (partitionLeaderEpoch). Thread-safe.

        Raises:
            ValueError: ``epoch`` is older than the latest epoch of the log.
        """
        with self._lock, self._w:
            self._check_open()
            cache = self.leader_epochs
            assert cache is not None
            if epoch < cache.latest_epoch:
                raise ValueError(f"{self.path}: leader epoch {epoch} is older than the log's latest "
                                 f"epoch {cache.latest_epoch}")
            cache.assign(epoch, self._appender.next_offset)
            self._appender.partition_leader_epoch = epoch

    @property
    def latest_epoch(self) -> int:
        """The newest leader epoch in the log's history, -1 when none."""
        with self._lock:
            self._check_open()
            assert self.leader_epochs is not None
            return self.leader_epochs.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) as Kafka's OffsetsForLeaderEpoch answers it (see
        :meth:`LeaderEpochCache.end_offset_for`). Thread-safe."""
        with self._lock:
            self._check_open()
            self._follow()
            assert self.leader_epochs is not None
            return self.leader_epochs.end_offset_for(epoch, self._appender.next_offset)

    def append_replicated(self, data: bytes | bytearray | memoryview) -> int:
        """Append batches copied from a leader byte for byte: offsets, timestamps and
        partitionLeaderEpoch are kept, and the epoch cache learns every new epoch. The first
        batch must start at or after the log end offset (a gap is allowed: a compacted leader
        has them). Returns the new log end offset. Durability as :meth:`append`. Thread-safe.

        Raises:
            CorruptRecordError: a batch is invalid (the valid batches before it are appended).
            OffsetOutOfRangeError: a batch starts below the log end (truncate first).
        """
        view = memoryview(data).cast("B")
        with self._lock, self._w:
            self._check_open()
            cache = self.leader_epochs
            assert cache is not None
            own_epoch = self._appender.partition_leader_epoch
            try:
                with self._io_guard():
                    self._copy_batches(view, cache)
            finally:
                if self._appender is not CLOSED_APPENDER:
                    self._appender.partition_leader_epoch = max(own_epoch, cache.latest_epoch)
            last = self._appender.next_offset
        if last - 1 >= self._flush_at:
            self._after_append(last - 1)
        return last

    def active_producers(self) -> dict[int, ProducerStateEntry]:
        """Each idempotent producer's state in this log by producer id (copies): its epoch and
        last batches, as :meth:`append_idempotent` checks them. The first use loads the state
        (the newest ``.snapshot``, then the batch headers after it). Thread-safe."""
        with self._lock, self._w:
            self._check_open()
            table = self._producers.current(self._log_start_offset, self._appender.next_offset)
            return {entry.producer_id: entry.copy() for entry in table.entries()}

    def _copy_batches(self, view: memoryview, cache: Any) -> None:
        """Append the batches in ``view`` as a leader stored them, teaching ``cache`` every new
        epoch. Each batch is validated first; the valid batches before an invalid one stay appended.

        Raises:
            CorruptRecordError: a batch is invalid.
            OffsetOutOfRangeError: a batch starts below the log end.
        """
        n = len(view)
        hdr = ffi.new("ls_batch_header *")
        crc = ffi.new("uint32_t *")
        limit = 0  # any size: the leader took the batch (Kafka's followers never check max.message.bytes)
        position = 0
        while position < n:
            chunk = view[position:]
            size = lib.ls_batch_validate(ffi.from_buffer(chunk), n - position, limit, hdr, crc)
            if size < 0:
                check(size, "<replicated data>", position, stored_crc=hdr.crc, computed_crc=crc[0],
                      size=hdr.batch_length + lib.LS_LOG_OVERHEAD, limit=limit)
            end = self._appender.next_offset
            if hdr.base_offset < end:
                raise OffsetOutOfRangeError(hdr.base_offset, self._log_start_offset, end,
                                            f"replicated batch for {self.path} overlaps the log")
            epoch = hdr.partition_leader_epoch
            if epoch > cache.latest_epoch:
                cache.assign(epoch, hdr.base_offset)
            if hdr.base_offset > end:
                self._skip_to(hdr.base_offset, hdr.last_offset_delta)
            self._appender.partition_leader_epoch = epoch
            marker = None
            if hdr.producer_id >= 0 and hdr.attributes & _MARKER_BITS == _MARKER_BITS:
                marker = read_marker(chunk, 0, size, self.path)
                if not self._producers.loaded:  # (the abort must be indexed: the state must be known)
                    self._producers.current(self._log_start_offset, self._appender.next_offset)
            batch = bytes(chunk[:size])
            offset = self._active.append_batch(batch, True)
            if offset == lib.LS_ERR_FULL:
                self._make_room(size)
                self._appender.partition_leader_epoch = epoch
                offset = self._active.append_batch(batch, True)
            if offset < 0:
                check(offset, self._active.path, size=size, limit=limit)
            if hdr.producer_id >= 0:  # learnt as it is, never checked
                self._index_completed(self._producers.learn(hdr.producer_id, hdr, offset, marker))
            position += size

    def _skip_to(self, base: int, last_offset_delta: int) -> None:
        """A replicated batch at ``base`` after a gap (a compacted leader): the log end jumps
        there. Offsets of one segment must stay within 2^31 of its base, so a non-empty active
        segment rolls when the batch would not fit, and an empty one is replaced."""
        active = self._segments.active
        assert active is not None
        if active.size > 0 and base - active.base_offset > 2**31 - 1 - last_offset_delta:
            self._roll()
            active = self._segments.active
            assert active is not None
        if active.size == 0 and active.base_offset != base:
            self._set_active(self._segments.replace_empty_active(base, self._appender.partition_leader_epoch))
            if len(self._segments) == 1:  # the log was empty: it now starts at base
                self._log_start_offset = base
                self._recovery_point = max(self._recovery_point, base)
                self._flushed_offset = max(self._flushed_offset, base)
        else:
            self._appender.next_offset = base

    # ------------------------------------------------------------------ truncation
    def truncate_to(self, offset: int) -> None:
        """Remove every record with offset >= ``offset`` (the log end becomes ``offset``).

        Below the log start this empties the log and restarts it at ``offset``. Durable on
        return. Thread-safe.
        """
        offset = _non_negative(offset, "truncate to")
        with self._lock, self._w:
            self._check_open()
            if offset >= self._appender.next_offset:
                return
            with self._io_guard():
                self._begin_layout_change()
                self._truncations += 1
                self._producers.before_truncation(offset)  # (durably, before the segments change)
                if offset <= self._log_start_offset:
                    self._set_active(self._segments.replace_all(offset))
                    self._log_start_offset = offset
                    self._producers.restarted(offset)
                else:
                    # The epoch stamped on appends stays the leader's: the active segment's
                    # appender may be a new one (a sealed segment activated, or a pinned file
                    # replaced), made with the segment's own epoch.
                    epoch = self._appender.partition_leader_epoch
                    self._set_active(self._segments.truncate_to(offset, self._builder, self._decoder))
                    self._appender.partition_leader_epoch = epoch
                _fileio.ops.fsync_dir(self.path)
                end = self._appender.next_offset
                self._producers.truncated(end)
                self._recovery_point = min(self._recovery_point, end)
                self._flushed_offset = min(self._flushed_offset, self._recovery_point)
                if self._high_watermark is not None:
                    self._high_watermark = min(self._high_watermark, end)
                if self.leader_epochs is not None:
                    self.leader_epochs.truncate_from_end(end)
                    if offset <= self._log_start_offset:
                        self.leader_epochs.truncate_from_start(offset)
                self._write_checkpoints()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every record and restart the log, empty, at ``offset`` (any offset >= 0; Kafka's
        truncateFullyAndStartAt): what a follower does when the leader's log start has moved
        past its log end, so that no record it holds can be kept. The leader epoch history is
        cleared too. Durable on return. Thread-safe."""
        offset = _non_negative(offset, "start a log at")
        with self._lock, self._w:
            self._check_open()
            with self._io_guard():
                self._truncations += 1
                self._producers.before_truncation(-1)  # every snapshot goes, durably, first
                self._set_active(self._segments.replace_all(offset))
                self._producers.restarted(offset)
                self._log_start_offset = offset
                self._recovery_point = self._flushed_offset = offset
                if self._high_watermark is not None:
                    self._high_watermark = offset
                if self.leader_epochs is not None:
                    self.leader_epochs.truncate_from_end(0)
                self._write_checkpoints()

    def start_from_tier(self, local_start: int, log_start: int, leader_epochs: Sequence[tuple[int, int]],
                        producer_snapshot: bytes | None) -> None:
        """Restart the log, empty, at ``local_start`` with the state the remote tier keeps for
        the offsets below it (Kafka's follower's buildProducerStateAndLeaderEpochCache): what a
        follower does when the leader's local segments start past its end, the records below
        being in the remote tier. ``leader_epochs`` [(epoch, start offset)] is the remote
        segment's leader-epoch checkpoint (its entries at or above ``local_start`` are left
        out), ``producer_snapshot`` its producer snapshot (the producers as of ``local_start``;
        None: none), and ``log_start`` (at most ``local_start``) the leader's log start: the
        offsets from it up to ``local_start`` are read from the remote tier. Durable on return.
        Thread-safe.

        Raises:
            ValueError: ``log_start`` above ``local_start``, or a bad epoch entry.
        """
        local_start = _non_negative(local_start, "start a log at")
        if not 0 <= log_start <= local_start:
            raise ValueError(f"log start {log_start} must lie in [0, {local_start}]")
        self.truncate_fully_and_start_at(local_start)
        with self._lock, self._w:
            self._check_open()
            with self._io_guard():
                if self.leader_epochs is not None:
                    for epoch, start in leader_epochs:
                        if start < local_start:
                            self.leader_epochs.assign(epoch, start)
                if producer_snapshot:
                    self._producers.write_snapshot(local_start, producer_snapshot)
                    self._producers.invalidate()  # loaded from that snapshot at its next use
                self._log_start_offset = log_start
                self._write_checkpoints()

    # ------------------------------------------------------------------ retention
    def delete_records_before(self, offset: int) -> int:
        """Advance the log start offset to ``offset`` (Kafka's DeleteRecords); return it.

        Records below become unreadable at once and whole segments below are deleted.
        ``offset`` may not exceed the high watermark. Durable on return. Thread-safe.
        """
        offset = check_offset(offset)
        with self._lock, self._w:
            self._check_open()
            hw = self._high_watermark if self._high_watermark is not None else self._appender.next_offset
            if offset > hw or offset < 0:
                raise OffsetOutOfRangeError(offset, self._log_start_offset, hw, "delete_records_before")
            if offset <= self._log_start_offset:
                return self._log_start_offset
            self._log_start_offset = offset
            self._write_checkpoints()  # durable before the segments below it go
            # (the start is where it must be; with tiered storage the first local segment may
            # lie far above it)
            self._delete_segments(self._segments.below(offset), move_start=False)
            return self._log_start_offset

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Delete whole segments past retention_ms / retention_bytes / the log start; return
        how many were deleted.

        Time: a segment goes when its newest record is older than retention_ms (the active
        segment too, after a roll, if it has expired). Size: the oldest sealed segments go
        while the log stays at or above retention_bytes without them. Only with a cleanup
        policy that includes "delete". Files are renamed ``.deleted`` and unlinked after
        file_delete_delay_ms. Thread-safe.
        """
        return self._enforce_retention(_time_ns() // 1_000_000 if now_ms is None else now_ms)

    def _enforce_retention(self, now_ms: int) -> int:
        """Log.enforce_retention: delete the segments retention lets go at ``now_ms``; return how
        many went."""
        copied = -1
        if self.config.remote_storage_enable:
            remote = self._remote
            copied = remote.copied_through() if remote is not None else -1  # (not under the lock)
        with self._lock, self._w:
            self._check_open()
            doomed = segments_to_delete(self._segments, self._log_start_offset, self.config, now_ms, copied)
            if not doomed:
                return 0
            # With tiered storage the records stay readable from the remote tier: the log start
            # stays where it is (only the local start moves).
            self._delete_segments(doomed, move_start=not self.config.remote_storage_enable)
            self._segments.unlink_due()
            return len(doomed)

    def _delete_segments(self, doomed: list[LogSegment], move_start: bool = True) -> None:
        """Remove segments from the log (rolling first when the active one is among them): move the
        log start past them durably (unless ``move_start`` is False: copied segments leaving the
        local disk), then rename their files .deleted (unlinked after file_delete_delay_ms)."""
        with self._io_guard():
            self._begin_layout_change()
            doomed = sorted(doomed, key=lambda s: s.base_offset)
            if any(segment is self._segments.active for segment in doomed):
                self._roll()
            first = log_start_after(self._segments, doomed, self._log_start_offset)
            if move_start and first > self._log_start_offset:
                # The renames may reach the disk in any order before the directory fsync; the
                # checkpoint written first is what the reopened log starts at: the log start moves
                # durably before any segment below it is renamed.
                self._log_start_offset = first
                self._write_checkpoints()
            # Without a move of the log start (copied segments leaving the local disk) the
            # deletions must reach the disk oldest first: a hole between local segments would
            # hide the records in it, which only the remote tier holds now.
            self._segments.delete(doomed, in_order=not move_start)
            self._producers.log_start_moved()

    # ------------------------------------------------------------------ compaction
    def compact(self, now_ms: int | None = None) -> CleanerReport:
        """Run one compaction pass now and report what it did.

        Keeps the latest record of every key among the sealed segments (the active segment is
        never touched), without changing offsets or order; tombstones survive for
        delete_retention_ms after the pass that first cleaned them, and the first pass after
        that removes them, dirty records or not; records younger than
        min_compaction_lag_ms are left for a later pass, and so are the records at or past the
        :attr:`last_stable_offset` (an open transaction's); records of aborted transactions go,
        and transaction markers once their transaction left no record (after a delete horizon,
        as tombstones). The dirty section starts at the
        ``cleaner-offset-checkpoint``; when it holds more keys than cleaner_dedupe_buffer_size
        can index, the pass cleans the prefix that fit and the next pass continues.

        Rewritten segments go through ``.cleaned`` -> ``.swap`` -> live, the old files through
        ``.deleted``; a crash at any step leaves the log as before or after the pass. A log
        whose cleanup policy does not include "compact" is left alone. Holds the log's lock for
        the pass (appends wait). Thread-safe.
        """
        with self._lock, self._w:
            self._check_open()
            with self._io_guard():
                return self._compaction.compact(self._segments, self.config, self._decoder, self._builder,
                                                self._log_start_offset, now_ms, self._producers_last_batches,
                                                self._last_stable_offset_locked)

    def _producers_last_batches(self) -> dict[int, int]:
        """Producer id -> last offset of its last batch, from the producer state (loaded on
        first use, as an idempotent append loads it). Held: the lock."""
        table = self._producers.current(self._log_start_offset, self._appender.next_offset)
        return {e.producer_id: e.last_batch.last_offset for e in table.entries() if e.last_batch is not None}

    def dirty_ratio(self) -> float:
        """Bytes of sealed segments at or after the cleaner's first dirty offset over all sealed
        bytes (Kafka's cleanable ratio). Thread-safe."""
        with self._lock:
            self._check_open()
            self._follow()
            return self._compaction.dirty_ratio(self._segments, self._log_start_offset)

    def needs_compaction(self, now_ms: int | None = None) -> bool:
        """True when the cleaner should pick this log: a compacted log, not marked uncleanable,
        whose dirty ratio reaches min_cleanable_dirty_ratio, whose oldest dirty segment is
        older than max_compaction_lag_ms, or that holds tombstones whose delete horizon has
        passed (Kafka's KIP-534: they go even when nothing is dirty). Thread-safe."""
        if not self._compaction.eligible(self.config):
            return False  # (without the lock: a closed log that is not compacted answers too)
        with self._lock:
            self._check_open()
            self._follow()
            return self._compaction.needs_compaction(self._segments, self.config, self._log_start_offset, now_ms)

    @property
    def cleaner_state(self) -> CleanerState:
        """The cleaner's view of this log: last run, last report, uncleanable reason."""
        return self._compaction.state

    def mark_uncleanable(self, reason: str) -> None:
        """Stop the background cleaner from picking this log (after an error), as Kafka's
        KIP-346 does; reopening the log clears it."""
        self._compaction.mark_uncleanable(reason)
        logger.error("%s: marked uncleanable: %s", self.path, reason)

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict[str, Any]:
        """This partition's metrics by name (see :mod:`logstore.metrics` for the names and meanings):
        appends and bytes in since this process opened the log (by any process), records and
        bytes this process read, offsets, size, segments, the fsync latency histogram, what the
        last open's recovery took and cut, and for compacted logs cleaner runs and dirty ratio.
        Thread-safe."""
        report = self.recovery_report
        with self._lock:
            self._check_open()
            self._follow()
            active = self._segments.active
            assert active is not None
            end = self._appender.next_offset
            out: dict[str, Any] = {
                "kafka.server:type=BrokerTopicMetrics,name=MessagesInPerSec": max(0, end - self._meter.end_at_open),
                "kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec": self._meter.bytes_in(active),
                "kafka.server:type=BrokerTopicMetrics,name=BytesOutPerSec": self._decoder.bytes_decoded,
                "logstore:type=Log,name=MessagesOut": self._decoder.records_decoded,
                "kafka.log:type=Log,name=LogStartOffset": self._log_start_offset,
                "kafka.log:type=Log,name=LogEndOffset": end,
                "kafka.log:type=Log,name=Size": self._segments.size_in_bytes,
                "kafka.log:type=Log,name=NumLogSegments": len(self._segments),
                "kafka.log:type=LogFlushStats,name=LogFlushRateAndTimeMs": self._flusher.times.snapshot(),
                "logstore:type=Log,name=RecoveryTimeMs": self.recovery_seconds * 1000.0,
                "logstore:type=Log,name=RecoveryBytesTruncated": report.bytes_truncated if report else 0,
            }
        if self.config.compacted:
            out["logstore:type=LogCleaner,name=CleanerRuns"] = self._compaction.runs
            out["logstore:type=LogCleaner,name=DirtyRatio"] = self.dirty_ratio()
        return out

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Flush, trim the active segment, write checkpoints and the clean-shutdown marker.

        Idempotent. After close every method raises LogClosedError. Thread-safe, but not inside
        :meth:`exclusive`: close waits for a running fsync of the group commit, whose leader
        needs the log's lock to record it (ARCHITECTURE.md, lock order), and a shared log's
        hold publishes its appends to the other processes only when the block ends.

        Raises:
            LogstoreError: called inside ``with log.exclusive():`` (the log stays open; close it
                after the block).
        """
        if self._exclusive.held():
            # Going on would take the Flusher's lock under the log's (a deadlock with an fsync
            # leader waiting for the log's lock) and, in a shared log, adopt the page the others
            # published, older than this hold's appends, and trim those away.
            raise LogstoreError(f"{self.path}: close() inside log.exclusive(): leave the block first")
        with self._flusher.lock, self._lock:
            if self._closed:
                return
            self._cancel_timers()
            self._waiters.wake_all()
            try:
                if self._share is not None:
                    if self._share.leave(self._lock_fd, self._offline is not None):
                        self._close_cleanly()  # the last process out
                    elif self._offline is None:
                        self._leave_shared()
                elif self._offline is None:
                    self._close_cleanly()
                # (offline: no clean-shutdown marker; the next open recovers from the disk)
            finally:
                self._release()

    def _abandon(self) -> None:
        """Drop maps and descriptors without flushing or marking a clean shutdown (tests:
        simulates the process dying)."""
        with self._lock:
            if self._closed:
                return
            self._cancel_timers()
            self._waiters.wake_all()
            self._release()

    def _close_cleanly(self) -> None:
        """Trim and fsync every segment, write the checkpoints and the producer state snapshot at
        the log end, then the clean-shutdown marker."""
        end = self._segments.last.next_offset
        producers = self._producers.snapshot_data(self._log_start_offset, end)  # (reads the segments)
        self._segments.close_all()
        self._recovery_point = end
        self._producers.write_snapshot(end, producers)  # every segment is fsynced: sound at the end
        try:
            self._write_checkpoints()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            # A full disk: every segment is fsynced, only the checkpoint files are stale. No
            # clean-shutdown marker, so the next open checks the segments past the old recovery
            # point instead of trusting them.
            logger.warning("%s: no space to update the checkpoint files at close; the next open "
                           "will run recovery: %s", self.path, exc)
            return
        self._loader.write_clean_shutdown_marker()

    def _cancel_timers(self) -> None:
        self._flusher.cancel()
        self._segments.cancel_timers()

    def _release(self) -> None:
        """Release every descriptor and map (segments not closed yet are abandoned)."""
        self._segments.abandon_all(closing=True)
        self._closed = True
        self._use_appender(CLOSED_APPENDER)
        # .lock before .shared: a process opening the log waits on the writers' lock (.shared) and
        # then tries .lock; released the other way round, the last process out could still hold
        # .lock exclusively when the opener gets there, which would refuse it.
        if self._lock_fd >= 0:
            _fileio.ops.close(self._lock_fd)
            self._lock_fd = -1
        if self._share is not None and self._share.state is not None:
            self._waiters.use_private_page()
            self._share.release()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"[{self._log_start_offset}, {self._appender.next_offset})"
        return f"Log({self.path!r}, {state})"

