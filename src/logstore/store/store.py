"""LogStore: a data directory of topics, laid out like one of Kafka's ``log.dirs``.

::

    <root>/
        meta.properties                     store format version and id; ``cluster.id``, the
                                            cluster the directory belongs to (a replica set's
                                            node, or Kafka's), once one is set
        .lock                               flock: shared by every process using the store
                                            (exclusive for a store opened with shared=False)
        .notify                             notification page long-polling consumers sleep on
        .topics/<topic>                     partition count, topic id and config overrides of a
                                            topic (Java properties; nothing else lives in .topics)
        .topic-defaults                     the dynamic defaults of every topic's config (Java
                                            properties; absent until set)
        .topics.lock                        flock serialising topic creation, changes and
                                            deletion, and the opening of partitions
        .topics.tmp                         a topic file being written
        .topics.adopt/                      topic files of a Kafka log directory being adopted
        .kafka-consumer-offsets/            Kafka's __consumer_offsets, set aside at adoption
        recovery-point-offset-checkpoint    Kafka's checkpoint files (every partition's entry)
        log-start-offset-checkpoint
        cleaner-offset-checkpoint
        <topic>-<partition>/                one Log per partition (see log.py), and Kafka's
                                            partition.metadata (the topic id, see topicids.py)

A directory without ``.topics/`` — one of a Kafka broker's ``log.dirs``, or a copy — is
adopted when a LogStore opens it: its partition directories become topics, by the rules of
:mod:`logstore.store.kafkadirs`, and their topic files are written (see :class:`LogStore`).

Background maintenance — retention, time-based flushes, delayed deletion of segment files and
the cleaner — runs on one scheduler thread per store that :meth:`LogStore.close` stops; with
``maintenance=False`` there is no thread and :meth:`LogStore.run_maintenance` does it all.

Thread-safety: every method may be called from any thread. Several processes may open the same
root at once (the default, ``shared=True``): partitions are opened with :meth:`Log.open_shared`.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterator, Mapping, Sequence, TypeVar

from .. import _fileio
from ..log.arrow import table as arrow_table
from . import kafkadirs
from .kafkadirs import LEGAL_TOPIC_NAME, is_internal_topic, validate_topic_name
from .layout import REMOTE_STORAGE_FILE, TOPICS_DIR, TopicEntry, parse_properties, read_remote_storage, \
    read_topic_entry, remote_storage_text, topic_file_text
from .topicids import new_topic_id, read_partition_metadata, topic_id_text, write_partition_metadata
from .._native import ffi, lib
from ..checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    OffsetCheckpoints,
)
from ..cleaner import Cleaner
from ..log.config import KAFKA_NAMES, LogConfig
from ..errors import (
    InconsistentTopicIdError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    LogClosedError,
    LogLockedError,
    LogstoreError,
    TopicExistsError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
)
from ..log.log import Log
from ..log.shared import new_notify_page

__all__ = ["LogStore", "TopicDescription", "validate_topic_name", "meta_properties"]

logger = logging.getLogger("logstore.store.store")

META_FILE = "meta.properties"
NOTIFY_FILE = ".notify"
LOCK_FILE = ".lock"
DELETE_SUFFIX = "-delete"
STORE_VERSION = 1
T = TypeVar("T")
#: the store's dynamic defaults of every topic's config (Kafka's dynamic broker configs
#: ``log.retention.ms``, ... under their topic-level names), Java properties
TOPIC_DEFAULTS_FILE = ".topic-defaults"
#: how long this process trusts what it read of a topic file before it looks again (a changed
#: count or config made by another process sharing the store is seen after at most this)
TOPIC_MAX_AGE_S = 1.0
#: Kafka's internal topic of the remote segments' metadata (tiered storage)
REMOTE_LOG_METADATA_TOPIC = "__remote_log_metadata"
#: the flock that makes one process of a shared store the one that copies and expires
REMOTE_LEAD_LOCK = ".lock-remote-log-manager"
_FIELD_TO_KAFKA = {field_name: kafka for kafka, field_name in KAFKA_NAMES.items()}


def meta_properties(root: str | os.PathLike[str]) -> dict[str, str]:
    """The data directory's ``meta.properties`` (``version``, ``directory.id``, ``cluster.id``
    once set, ...); empty when there is none. Reads the file (through ``_fileio``); thread-safe."""
    path = os.path.join(os.fspath(root), META_FILE)
    if not _fileio.ops.exists(path):
        return {}
    return parse_properties(_fileio.ops.read_file(path).decode("utf-8", "replace"), path)


@dataclass(frozen=True)
class TopicDescription:
    """What :meth:`LogStore.describe` reports about a topic."""

    name: str
    partitions: int
    #: The effective configuration (store defaults with the topic's overrides applied).
    config: LogConfig
    #: The topic's own settings, by Kafka's dotted names, as persisted in the store.
    overrides: dict[str, str] = field(default_factory=dict)
    internal: bool = False
    #: The topic's id (KIP-516), fixed when it was created.
    topic_id: uuid.UUID | None = None


class LogStore:
    """A directory of topics, each a set of partitions, each a :class:`Log`.

    >>> import tempfile
    >>> with LogStore(tempfile.mkdtemp(), maintenance=False) as store:
    ...     store.create_topic("events", partitions=2, retention_ms=3_600_000)
    ...     store.partition("events", 1).append(b"hello")
    ...     store.describe("events").config.retention_ms
    0
    3600000

    Args:
        root: the data directory (created if missing).
        shared: let other processes open the same root at the same time (default). With False
            this process holds the store exclusively, and appends skip the cross-process lock.
        maintenance: run the scheduler thread (retention, flush_ms, file deletion, cleaner).
        retention_check_interval_ms: how often retention runs (Kafka's
            ``log.retention.check.interval.ms``).
        cleaner_backoff_ms: how often the cleaner looks for work (``log.cleaner.backoff.ms``).
        cleaner: run the cleaner for topics whose cleanup policy includes "compact".
        transaction_fsync: the store's transaction coordinator (its transactional producers,
            and a Kafka listener over it) fsyncs its two-phase commit: what a committed
            transaction wrote survives power loss whole (FORMAT.md §15). Off: durable against a
            crash of the process, as an append is by default.
        topic_ids: how the id of a new topic is made from its name (KIP-516), for topics
            created here and for those of a store written before topic ids: by default a
            random one, as Kafka's controller makes it. A replica set derives its topics' ids
            so that every node gives a topic the same one.
        remote_storage: tiered storage (KIP-405): the object store that topics with
            ``remote_storage_enable`` copy their sealed segments to, as a URL
            (``file:///path``: a local directory, no server; ``s3://bucket/prefix``,
            ``gs://...``, ``az://...`` with ``remote_storage_options``, credentials from the
            environment as the cloud's own tools read them) or a
            :class:`~logstore.tiered.storage.RemoteStorageManager` of your own. A URL is
            remembered in the store's ``.remote-storage`` (credentials left out), so later opens
            (and the read-only views, the tools and Spark) find the tier without it. None: the
            remembered one, if any; else no topic may enable remote storage. See
            :mod:`logstore.tiered.manager`.
        remote_storage_options: the object store's settings (obstore's names: ``endpoint``,
            ``region``, ``allow_http``, ...).
        remote_log_metadata_manager: a callable given the store's ``__remote_log_metadata``
            log that returns the :class:`~logstore.tiered.rlmm.RemoteLogMetadataManager` to
            use (default: the topic-based one).
        remote_log_manager_task_interval_ms, remote_fetch_max_wait_ms,
        remote_log_index_cache_size_bytes: Kafka's broker settings of those names
            (``remote.log.manager.task.interval.ms``, ...; see
            :class:`~logstore.tiered.manager.RemoteLogManagerConfig`).
        remote_log_leads: asked with a tiered partition's log before each round of the remote
            log manager copies and expires it (its ``leads``): a replica set's node tiers only
            the partitions it leads. None: every partition.
        remote_log_broker_id: the broker id the remote segments' metadata events name (a
            replica set's node id; 0 for a store of its own).
        **defaults: LogConfig fields applied to every topic unless the topic overrides them, or
            the store's dynamic defaults (:meth:`alter_defaults`, Kafka's dynamic broker
            configs) set them.

    Kafka log directories: opened on a directory without ``.topics/`` that holds partition
    directories ``<topic>-<n>`` (a Kafka broker's ``log.dirs`` entry, or a copy), the store
    adopts them as topics for good, by the rules of :mod:`logstore.store.kafkadirs`: a topic per
    name with the highest partition number + 1 partitions (missing ones empty) and the store's
    defaults as its config; ``__consumer_offsets`` only when the store's consumer groups can
    share it, else it is moved into ``.kafka-consumer-offsets/``. The topic files are written
    under the topic lock and appear at once (``.topics.adopt/`` renamed to ``.topics/``), so
    concurrent opens adopt once and a crash leaves all or nothing. Kafka does not load a log
    directory holding ``.topics/``: to read one that a broker will use again, use the read-only
    :class:`~logstore.store.views.StoreView` or the read-only commands, which adopt in memory.
    :attr:`adopted` names the topics this open adopted (empty for a store).

    Topic ids (KIP-516, :mod:`logstore.store.topicids`): every topic has one, kept in its
    topic file and copied into Kafka's ``partition.metadata`` in each partition directory when
    the partition is opened; a topic deleted and created again has a new one. An adopted Kafka
    topic keeps the id of its ``partition.metadata``; a topic of a store written before topic
    ids gets one when the store is opened (durable, once, under the topic lock).

    Raises:
        LogLockedError: the store is open exclusively elsewhere (or this open is exclusive and
            another holds it), or a running Kafka broker holds the log directory's lock.
        LogstoreError: ``meta.properties`` names a store version this logstore cannot read.

    Durability and thread-safety: as :class:`Log` for each partition. Topic creation,
    deletion and adoption are durable on return and serialised across processes.
    """

    def __init__(self, root: str | os.PathLike[str], *, shared: bool = True, maintenance: bool = True,
                 retention_check_interval_ms: int = 300_000, cleaner_backoff_ms: int = 15_000,
                 cleaner: bool = True, transaction_fsync: bool = False,
                 topic_ids: Callable[[str], uuid.UUID] | None = None, remote_storage: Any = None,
                 remote_storage_options: Mapping[str, str] | None = None,
                 remote_log_metadata_manager: Callable[[Log], Any] | None = None,
                 remote_log_manager_task_interval_ms: int = 30_000, remote_fetch_max_wait_ms: int = 500,
                 remote_log_index_cache_size_bytes: int = 1 << 30,
                 remote_log_leads: Callable[[Log], bool] | None = None, remote_log_broker_id: int = 0,
                 **defaults: Any) -> None:
        self.root = os.path.abspath(os.fspath(root))
        if remote_storage is None:
            remembered = read_remote_storage(self.root)
            if remembered is not None:
                remote_storage, remote_storage_options = remembered[0], {**remembered[1],
                                                                         **(remote_storage_options or {})}
        self._remote_spec = (remote_storage, dict(remote_storage_options or {}), remote_log_metadata_manager,
                             remote_log_manager_task_interval_ms, remote_fetch_max_wait_ms,
                             remote_log_index_cache_size_bytes)
        self._remote: Any = None  # the RemoteLogManager, made on first use
        self._remote_leads = remote_log_leads
        self._remote_broker_id = remote_log_broker_id
        #: logs whose topic enabled remote storage in another process before this one had a manager
        self._attach_pending: list[tuple[Log, str]] = []
        self._remote_lead_fd = -1  # the flock that makes this process the one that copies
        self._maintenance = maintenance
        #: the defaults this store object was opened with (Kafka's static broker configs)
        self.static_defaults = LogConfig.build(None, **defaults)
        _no_remote_default(self.static_defaults.remote_storage_enable)
        #: the defaults every topic's config starts from: the static ones with the store's
        #: dynamic defaults (``.topic-defaults``, :meth:`alter_defaults`) over them
        self.defaults = self.static_defaults
        self._dynamic = _TopicEntry(0, {}, None, 0.0)  # the .topic-defaults file as last read
        self.shared = shared
        #: the transaction coordinator fsyncs its two-phase commit (see the arguments)
        self.transaction_fsync = bool(transaction_fsync)
        self.retention_check_interval_ms = _positive("retention_check_interval_ms", retention_check_interval_ms)
        self.cleaner_backoff_ms = _positive("cleaner_backoff_ms", cleaner_backoff_ms)
        self._lock = threading.RLock()
        self._logs: dict[tuple[str, int], Log] = {}
        self._clients: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._closers: list[Any] = []
        self._topics_cache: dict[str, _TopicEntry] = {}
        self._new_topic_id: Callable[[str], uuid.UUID] = topic_ids or (lambda name: new_topic_id())
        #: topic name <-> id, as the topic files said when last read (the files are the home)
        self._ids: dict[str, uuid.UUID] = {}
        self._names: dict[uuid.UUID, str] = {}
        self._closed = False
        self._closing = False
        self._cleaner = Cleaner() if cleaner else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._notify_mm: mmap.mmap | None = None
        ops = _fileio.ops
        ops.makedirs_durable(self.root)
        self._lock_fd = ops.open(os.path.join(self.root, LOCK_FILE), os.O_RDWR | os.O_CREAT)
        locked = ops.lock_shared(self._lock_fd) if shared else ops.lock(self._lock_fd)
        if not locked:
            ops.close(self._lock_fd)
            raise LogLockedError(f"store {self.root} is open {'exclusively ' if shared else ''}in another process")
        try:
            #: topics this open adopted from a Kafka log directory (see the class docstring)
            self.adopted: tuple[str, ...] = self._ensure_topics_dir()
            self._write_meta()
            self._assign_topic_ids()
            self._read_dynamic_defaults(force=True)
            self._set_aside_orphans()
            self._remove_deleted_topics()
            self.notify_page = self._map_notify_page()
        except BaseException:
            ops.close(self._lock_fd)
            raise
        if maintenance:
            self._start_remote_if_tiered()
            self._thread = threading.Thread(target=self._run, name=f"logstore-maintenance[{self.root}]", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ setup
    def _write_meta(self) -> None:
        path = os.path.join(self.root, META_FILE)
        ops = _fileio.ops
        if ops.exists(path):
            props = parse_properties(ops.read_file(path).decode("utf-8", "replace"), path)
            version = props.get("version")
            if version is None or not version.isdigit() or int(version) > STORE_VERSION:
                raise LogstoreError(f"{path}: store format version {version!r} is not supported "
                                    f"(this logstore reads version {STORE_VERSION})")
            return
        with self._metadata_lock():
            if not ops.exists(path):
                text = f"#logstore data directory\nversion={STORE_VERSION}\ndirectory.id={uuid.uuid4()}\n"
                ops.write_file_atomic(path, text.encode())

    def set_cluster_id(self, cluster_id: str) -> None:
        """Record in ``meta.properties`` that this directory belongs to the cluster ``cluster_id``
        (Kafka's ``cluster.id``, as ``kafka-storage format`` writes it). Durable on return
        (atomic rewrite); a no-op when it is recorded already. Thread-safe (the store's
        metadata lock, across processes too).

        Raises:
            LogstoreError: the directory belongs to another cluster already.
        """
        path = os.path.join(self.root, META_FILE)
        with self._metadata_lock():
            current = meta_properties(self.root).get("cluster.id")
            if current == cluster_id:
                return
            if current:
                raise LogstoreError(f"{path}: this data directory belongs to cluster {current}, not {cluster_id}")
            text = _fileio.ops.read_file(path).decode("utf-8", "replace")
            text = (text if text.endswith("\n") else text + "\n") + f"cluster.id={cluster_id}\n"
            _fileio.ops.write_file_atomic(path, text.encode())

    def _ensure_topics_dir(self) -> tuple[str, ...]:
        """Create ``.topics/``, adopting the partition directories of a Kafka log directory;
        return the names of the topics adopted (see :func:`logstore.store.kafkadirs.adopt`)."""
        return kafkadirs.adopt(self.root, TOPICS_DIR, self._metadata_lock, topic_file_text, self._new_topic_id)

    def _assign_topic_ids(self) -> None:
        """Give every topic of a store written before topic ids its id (durable). The id found
        in one of its partitions' ``partition.metadata`` (a Kafka log directory adopted before
        topic ids) wins over a new one. Idempotent and safe with other processes opening the
        store: each file is re-read under the topic lock before it is rewritten."""
        topics_dir = os.path.join(self.root, TOPICS_DIR)
        missing = [name for name in _fileio.ops.listdir(topics_dir) if LEGAL_TOPIC_NAME.fullmatch(name)
                   and (entry := read_topic_entry(os.path.join(topics_dir, name))) is not None
                   and entry.topic_id is None]
        if not missing:
            return
        with self._metadata_lock():
            for name in missing:
                entry = self._read_topic(name)
                if entry is None or entry.topic_id is not None:
                    continue
                topic_id = None
                for p in range(entry.partitions):
                    topic_id = read_partition_metadata(os.path.join(self.root, f"{name}-{p}"))
                    if topic_id is not None:
                        break
                if topic_id is None:
                    topic_id = self._new_topic_id(name)
                self._write_topic(name, entry.partitions, topic_id, entry.overrides)
                for p in range(entry.partitions):  # the copies (a mismatch is refused when opened)
                    directory = os.path.join(self.root, f"{name}-{p}")
                    if _fileio.ops.exists(directory) and read_partition_metadata(directory) is None:
                        write_partition_metadata(directory, topic_id)
                logger.info("%s: topic %s has no topic id (a store written before topic ids): gave it %s",
                            self.root, name, topic_id_text(topic_id))

    def _map_notify_page(self) -> Any:
        if not self.shared:
            return new_notify_page()
        ops = _fileio.ops
        fd = ops.open(os.path.join(self.root, NOTIFY_FILE), os.O_RDWR | os.O_CREAT)
        try:
            if ops.fsize(fd) < lib.LS_SHARED_SIZE:
                ops.ftruncate(fd, lib.LS_SHARED_SIZE)  # zeros: counter 0, no waiters
            self._notify_mm = ops.mmap(fd, lib.LS_SHARED_SIZE, True)
        finally:
            ops.close(fd)
        return ffi.from_buffer(self._notify_mm)

    def _set_aside_orphans(self) -> None:
        """Rename ``*-delete`` every partition directory of a user topic that has no topic
        file, or a number not below its topic's count: what a crash inside
        :meth:`delete_topic` left (the topic file is unlinked before the directories are
        renamed), or a store written before deletion counted the directories themselves.
        Left there, a topic created again under that name would refuse them (another topic
        id) or, without ``partition.metadata``, take up the deleted topic's records.

        Internal topics (``__consumer_offsets``, ...) are left alone: their directories may
        come before their topic file (created on first use), and their records are not the
        user's to lose. A directory whose log another process holds open is left too (logged).
        Runs after adoption (a Kafka log directory's partitions all have topic files by then),
        each candidate checked again under the metadata lock."""
        candidates = self._orphans()
        if not candidates:
            return
        with self._metadata_lock():
            for name in self._orphans():
                self._set_aside(name, "its topic does not have it (a deletion a crash cut short)")
            _fileio.ops.fsync_dir(self.root)

    def _orphans(self) -> list[str]:
        """The user topics' partition directories that no topic file counts."""
        topics_dir = os.path.join(self.root, TOPICS_DIR)
        if not _fileio.ops.exists(topics_dir):
            return []
        found = []
        counts: dict[str, int] = {}  # each topic file read once
        for name in _fileio.ops.listdir(self.root):
            parsed = kafkadirs.parse_partition_dir(name)
            if not isinstance(parsed, tuple) or is_internal_topic(parsed[0]):
                continue
            topic, number = parsed
            if topic not in counts:
                entry = self._read_topic(topic)
                counts[topic] = 0 if entry is None else entry.partitions
            if number >= counts[topic] and os.path.isdir(os.path.join(self.root, name)):
                found.append(name)
        return found

    def _partition_dirs(self, topic: str) -> dict[int, str]:
        """Every directory ``<topic>-<n>`` in the root, whatever the topic file counts."""
        found = {}
        for name in _fileio.ops.listdir(self.root):
            parsed = kafkadirs.parse_partition_dir(name)
            if isinstance(parsed, tuple) and parsed[0] == topic and os.path.isdir(os.path.join(self.root, name)):
                found[parsed[1]] = name
        return found

    def _set_aside(self, name: str, why: str) -> str | None:
        """Rename the partition directory ``name`` to a ``.<random>-delete`` name (with the
        metadata lock held; the caller fsyncs the root and removes it), unless another process
        has its log open; return where it went, None when left. Kafka's
        ``<topic>-<p>.<id>-delete`` can exceed NAME_MAX for long topic names; ``.<id>-delete``
        never does, nor can it look like a partition."""
        directory = os.path.join(self.root, name)
        lock = _FileLock(os.path.join(directory, LOCK_FILE), blocking=False)
        if not lock.acquired:
            logger.warning("%s: %s: %s, but a process has it open: left", self.root, name, why)
            return None
        target = os.path.join(self.root, f".{uuid.uuid4().hex}{DELETE_SUFFIX}")
        try:
            _fileio.ops.rename(directory, target)
        finally:
            lock.release()
        logger.warning("%s: %s: %s: set aside for deletion", self.root, name, why)
        return target

    def _set_aside_all(self, topic: str, first: int, action: str) -> list[str]:
        """Set aside ``topic``'s directories numbered ``first`` and up (with the metadata lock
        held, before its topic file counts them): left by a topic of that name deleted in a
        crash, they would refuse the new one's id, or lend it their records. Returns where
        they went.

        Raises:
            LogLockedError: another process has one open (nothing of the topic is written).
        """
        aside = []
        for number, leftover in sorted(self._partition_dirs(topic).items()):
            if number < first:
                continue
            target = self._set_aside(leftover, "a directory left by an earlier topic of that name")
            if target is None:
                raise LogLockedError(f"cannot {action} topic {topic!r}: {leftover}, left by an earlier topic of "
                                     f"that name, is open in another process")
            aside.append(target)
        if aside:
            _fileio.ops.fsync_dir(self.root)
        return aside

    def _remove_trees(self, targets: Sequence[str]) -> None:
        """Remove directories renamed ``*-delete`` (a failure is logged: the next open of the
        store finishes the removal)."""
        for target in targets:
            try:
                _fileio.ops.remove_tree(target)
            except OSError as exc:
                logger.warning("%s: could not remove %s: %s", self.root, target, exc)

    def _remove_deleted_topics(self) -> None:
        """Finish topic deletions that a crash interrupted (directories renamed ``*-delete``)."""
        for name in _fileio.ops.listdir(self.root):
            if name.endswith(DELETE_SUFFIX) and os.path.isdir(os.path.join(self.root, name)):
                try:
                    _fileio.ops.remove_tree(os.path.join(self.root, name))
                except OSError as exc:
                    logger.warning("%s: could not remove %s: %s", self.root, name, exc)

    def _metadata_lock(self) -> "_FileLock":
        return _FileLock(os.path.join(self.root, TOPICS_DIR + LOCK_FILE))

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> "LogStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"store {self.root} is closed")

    # ------------------------------------------------------------------ topics
    def _topic_file(self, name: str) -> str:
        return os.path.join(self.root, TOPICS_DIR, name)

    def _read_topic(self, name: str) -> TopicEntry | None:
        return read_topic_entry(self._topic_file(name))

    def _topic(self, name: str, fresh: bool = False) -> tuple[int, dict[str, str]]:
        """(partition count, overrides) of a topic: cached, and checked against its file at most
        every TOPIC_MAX_AGE_S (``fresh``: now), so that what another process changed (a count
        grown, configs altered, the topic deleted) is seen here, as a Kafka client's metadata
        refresh sees it."""
        validate_topic_name(name)
        now = time.monotonic()
        with self._lock:
            cached = self._topics_cache.get(name)
            if cached is not None and not fresh and now - cached.checked < TOPIC_MAX_AGE_S:
                return cached.partitions, cached.overrides
        found = self._read_topic(name)
        if found is None:
            with self._lock:
                self._topics_cache.pop(name, None)
                self._forget_id(name)
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist in {self.root}")
        self._take_entry(name, found, now)
        return found.partitions, found.overrides

    def _take_entry(self, name: str, found: TopicEntry, now: float) -> None:
        """Cache what the topic file says now; when it says something else than the cache did
        (or the first time), the topic's open logs take its config."""
        entry = _TopicEntry(found.partitions, found.overrides, found.topic_id, now)
        with self._lock:
            cached = self._topics_cache.get(name)
            self._topics_cache[name] = entry
            if found.topic_id is not None:
                self._remember_id(name, found.topic_id)
            if cached is not None and cached.same_file(entry):
                return
            changes = self._config_changes(name, entry.partitions, self._config_for(entry.overrides))
        self._apply_changes(changes)

    def _config_changes(self, name: str, partitions: int, config: LogConfig) -> list[tuple[str, int, Log, LogConfig]]:
        """The topic's open logs whose config is not ``config`` (with the store's lock held):
        what :meth:`_apply_changes` gives them once the store's lock is released."""
        changes = []
        for p in range(partitions):
            log = self._logs.get((name, p))
            if log is not None and not log.closed and log.config != config:
                changes.append((name, p, log, config))
        return changes

    def _apply_changes(self, changes: Sequence[tuple[str, int, Log, LogConfig]]) -> None:
        """Give each log its topic's new config, without the store's lock: a log's lock may be
        held for a whole cleaner pass, and the store's lock must not wait for it (every topic's
        lookups would)."""
        for name, p, log, config in changes:
            try:
                log.update_config(config)
                if config.remote_storage_enable and log.remote_tier is None:
                    if self._remote is not None:
                        self._remote.attach(log, self.topic_id(name))
                    else:  # (the manager is made under the metadata lock, which may be held here)
                        with self._lock:
                            self._attach_pending.append((log, name))
            except LogClosedError:
                continue  # its topic was deleted, or the store closed, meanwhile
            if self._cleaner is not None:
                (self._cleaner.add if config.compacted else self._cleaner.remove)(log)
            logger.info("%s: %s-%d takes its topic's new config", self.root, name, p)

    def _remember_id(self, name: str, topic_id: uuid.UUID) -> None:
        """Cache that ``name`` has ``topic_id`` (under the store's lock)."""
        old = self._ids.get(name)
        if old is not None and old != topic_id:
            self._names.pop(old, None)
        self._ids[name] = topic_id
        self._names[topic_id] = name

    def _forget_id(self, name: str) -> None:
        """Drop ``name``'s cached id (under the store's lock): its topic was deleted."""
        old = self._ids.pop(name, None)
        if old is not None and self._names.get(old) == name:
            del self._names[old]

    def topic_id(self, name: str) -> uuid.UUID:
        """The topic's id (KIP-516): a random UUID fixed when the topic was created (see the
        class docstring). Thread-safe.

        Raises:
            UnknownTopicOrPartitionError: no such topic.
        """
        self._topic(name)
        with self._lock:
            found = self._ids.get(name)
        if found is not None:
            return found
        entry = self._read_topic(name)  # written by another process after this one read it
        if entry is None or entry.topic_id is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist in {self.root}")
        with self._lock:
            self._remember_id(name, entry.topic_id)
        return entry.topic_id

    def topic_name(self, topic_id: uuid.UUID) -> str:
        """The name of the topic whose id is ``topic_id``. Thread-safe.

        Raises:
            UnknownTopicIdError: no topic has this id (it never existed, or its topic was
                deleted, perhaps created again with another id).
        """
        if not isinstance(topic_id, uuid.UUID) or topic_id.int == 0:  # Kafka's "no id" names no topic
            raise UnknownTopicIdError(f"no topic has id {topic_id!r} in {self.root}")
        with self._lock:
            name = self._names.get(topic_id)
        if name is not None:
            try:
                if self.topic_id(name) == topic_id:
                    return name
            except UnknownTopicOrPartitionError:
                pass
        for name in self.topics(internal=True):  # created by another process, or not read yet
            try:
                if self.topic_id(name) == topic_id:
                    return name
            except UnknownTopicOrPartitionError:
                continue
        raise UnknownTopicIdError(f"no topic has id {topic_id_text(topic_id)} in {self.root}")

    def create_topic(self, name: str, partitions: int = 1, *, exist_ok: bool = False, internal: bool = False,
                     **config: Any) -> None:
        """Create a topic with ``partitions`` partitions and config overrides (LogConfig field
        names as keywords, e.g. ``retention_ms=3_600_000``; Kafka's dotted names work too, as
        ``**{"retention.ms": 3_600_000}``).

        Raises:
            InvalidTopicError: an illegal name, or a name starting with "__" (reserved for
                internal topics such as ``__consumer_offsets``). Nothing is written.
            TopicExistsError: the topic exists (unless ``exist_ok``; its settings are then kept).
            InvalidConfigError: a bad setting (nothing is written).

        Durable on return: the topic's properties file and partition directories are fsynced.
        """
        validate_topic_name(name)
        if is_internal_topic(name) and not internal:
            raise InvalidTopicError(f"topic names starting with '__' are reserved for internal topics: {name!r}")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= 1_000_000:
            raise InvalidConfigError(f"partitions must be an int from 1 to 1000000, got {partitions!r}")
        overrides = self._overrides(config)
        self._check_open()
        tiered = self._config_for(overrides).remote_storage_enable
        if tiered:
            self._check_remote_storage(name)
        with self._metadata_lock():
            if tiered:
                self._remote_manager_locked()
            existing = self._read_topic(name)
            if existing is not None:
                if exist_ok:
                    return
                raise TopicExistsError(f"topic {name!r} already exists in {self.root}")
            aside = [] if is_internal_topic(name) else self._set_aside_all(name, 0, "create")
            topic_id = self._new_topic_id(name)
            self._write_topic(name, partitions, topic_id, overrides)
            for partition in range(partitions):
                self._open_partition(name, partition)
        _fileio.ops.fsync_dir(self.root)
        self._remove_trees(aside)
        logger.info("%s: created topic %s with %d partition(s)", self.root, name, partitions)

    def _write_topic(self, name: str, partitions: int, topic_id: uuid.UUID, overrides: Mapping[str, str]) -> None:
        """Replace a topic's file durably (with the metadata lock held): a crash leaves the old
        file or the new one whole (write_file_atomic); this process's cache forgets the old and
        knows the id."""
        _fileio.ops.write_file_atomic(self._topic_file(name), topic_file_text(partitions, topic_id, overrides),
                                      tmp=os.path.join(self.root, TOPICS_DIR + ".tmp"))
        with self._lock:
            self._topics_cache.pop(name, None)
            self._remember_id(name, topic_id)

    def create_partitions(self, name: str, count: int, *, validate_only: bool = False) -> None:
        """Grow a topic to ``count`` partitions (Kafka's CreatePartitions); the new ones are
        empty, the others keep their records (so a key's partition changes for a hash
        partitioner, as in Kafka).

        Raises:
            UnknownTopicOrPartitionError: no such topic.
            InvalidPartitionsError: ``count`` is not larger than the topic's partition count,
                or above 1000000. Nothing is written.

        Durable on return. Crash-safe: the topic file, which holds the count, is replaced
        atomically before any new partition directory is made, so a crash leaves the old count
        or the new one; a new partition whose directory a crash left missing or partly made is
        opened (and recovered) as an empty log on first use. Other processes sharing the store
        see the new count on their next look at the topic (at most TOPIC_MAX_AGE_S later; at
        once when they ask for a partition past the count they know). Thread-safe.
        """
        self._check_open()
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"count must be an int, got {count!r}")
        with self._metadata_lock():
            current, overrides = self._topic(name, fresh=True)
            if count <= current:
                raise InvalidPartitionsError(f"topic {name!r} has {current} partition(s); the count can only grow, "
                                             f"not to {count}")
            if count > 1_000_000:
                raise InvalidPartitionsError(f"topic {name!r}: {count} partitions, more than 1000000")
            if validate_only:
                return
            aside = [] if is_internal_topic(name) else self._set_aside_all(name, current, "grow")
            self._write_topic(name, count, self.topic_id(name), overrides)
            for partition in range(current, count):
                self._open_partition(name, partition)
        _fileio.ops.fsync_dir(self.root)
        self._remove_trees(aside)
        logger.info("%s: topic %s grown from %d to %d partition(s)", self.root, name, current, count)

    def alter_topic_config(self, name: str, edit: Callable[[dict[str, str]], Mapping[str, Any]], *,
                           validate_only: bool = False) -> dict[str, str]:
        """Replace a topic's config overrides by ``edit(current)`` (Kafka's AlterConfigs and
        IncrementalAlterConfigs): ``edit`` is given the current overrides by Kafka's dotted
        names (a copy) and returns the new set, by Kafka's names; it runs with the topic
        metadata lock held, so concurrent changes from any process apply one after the other.
        The topic's open logs take the new config at once (:meth:`Log.update_config`); returns
        the new overrides as stored (strings).

        Raises:
            UnknownTopicOrPartitionError: no such topic.
            InvalidConfigError: a name LogConfig does not know or a bad value (nothing is written).

        Durable on return: the topic file is replaced atomically. Other processes sharing the
        store apply the change to their open logs at their next look at the topic (their
        maintenance thread looks every TOPIC_MAX_AGE_S or so). Thread-safe.
        """
        self._check_open()
        with self._metadata_lock():
            partitions, current = self._topic(name, fresh=True)
            wanted = edit(dict(current))
            overrides = self._overrides(wanted)
            config = self._config_for(overrides)
            if self._config_for(current).remote_storage_enable and not config.remote_storage_enable:
                raise InvalidConfigError(f"topic {name!r}: remote.storage.enable cannot be turned off once on "
                                         f"(its older segments are only in the remote tier)")
            if config.remote_storage_enable:
                self._check_remote_storage(name)
            if validate_only:
                return overrides
            if config.remote_storage_enable:
                self._remote_manager_locked()
            topic_id = self.topic_id(name)
            self._write_topic(name, partitions, topic_id, overrides)
            with self._lock:
                self._topics_cache[name] = _TopicEntry(partitions, overrides, topic_id, time.monotonic())
                changes = self._config_changes(name, partitions, config)
        self._apply_changes(changes)
        logger.info("%s: topic %s config overrides now %s", self.root, name, overrides)
        return dict(overrides)

    # ------------------------------------------------------------------ dynamic defaults
    @property
    def dynamic_defaults(self) -> dict[str, str]:
        """The store's dynamic defaults by Kafka's topic config names (a copy): set with
        :meth:`alter_defaults`, they take precedence over the defaults a store object is opened
        with, as Kafka's dynamic broker configs over its static ones."""
        self._read_dynamic_defaults()
        return dict(self._dynamic.overrides)

    def alter_defaults(self, edit: Callable[[dict[str, str]], Mapping[str, Any]], *,
                       validate_only: bool = False) -> dict[str, str]:
        """Replace the store's dynamic defaults by ``edit(current)`` (Kafka's dynamic broker
        configs ``log.retention.ms``, ``log.segment.bytes``, ... by their topic-level names:
        ``retention.ms``, ``segment.bytes``): ``edit`` gets the current ones by Kafka's topic
        config names and returns the new set; it runs with the topic metadata lock held. Every
        topic takes the new defaults where it does not override them, its open logs at once;
        returns the new dynamic defaults as stored.

        Raises:
            InvalidConfigError: a name LogConfig does not know or a bad value (nothing is written).

        Durable on return (``.topic-defaults`` replaced atomically); other processes sharing
        the store take them within about TOPIC_MAX_AGE_S (their maintenance thread looks).
        Thread-safe.
        """
        self._check_open()
        with self._metadata_lock():
            self._read_dynamic_defaults(force=True)
            wanted = edit(dict(self._dynamic.overrides))
            stored = self._dynamic_overrides(wanted)
            if validate_only:
                return stored
            path = os.path.join(self.root, TOPIC_DEFAULTS_FILE)
            if stored:
                _fileio.ops.write_file_atomic(path, _properties_text(stored))
            elif _fileio.ops.exists(path):
                _fileio.ops.unlink(path)
                _fileio.ops.fsync_dir(self.root)
            self._read_dynamic_defaults(force=True)
        logger.info("%s: dynamic defaults now %s", self.root, stored)
        return dict(stored)

    def _dynamic_overrides(self, wanted: Mapping[str, Any]) -> dict[str, str]:
        """Dynamic defaults validated over the static ones; by Kafka's names as strings."""
        plain = {k: v for k, v in wanted.items() if "." not in k}
        dotted = {k: str(v) for k, v in wanted.items() if "." in k}
        merged = self.static_defaults.replace(**plain)
        merged = LogConfig.from_kafka({**merged.to_kafka(), **dotted})
        _no_remote_default(merged.remote_storage_enable)
        kafka = merged.to_kafka()
        return {name: kafka[name] for name in {_FIELD_TO_KAFKA[k] for k in plain} | set(dotted)}

    def _read_dynamic_defaults(self, force: bool = False) -> None:
        """Take up ``.topic-defaults`` when it changed (looked at most every TOPIC_MAX_AGE_S
        unless ``force``): the defaults change, and so do the open logs' configs."""
        now = time.monotonic()
        cached = self._dynamic
        if not force and now - cached.checked < TOPIC_MAX_AGE_S:
            return
        path = os.path.join(self.root, TOPIC_DEFAULTS_FILE)
        try:
            props = parse_properties(_fileio.ops.read_file(path).decode("utf-8"), path)
        except FileNotFoundError:
            props = {}
        if props == cached.overrides and cached.checked:
            cached.checked = now
            return
        try:
            defaults = LogConfig.from_kafka({**self.static_defaults.to_kafka(), **props}) if props else \
                self.static_defaults
        except InvalidConfigError as exc:
            raise LogstoreError(f"{path}: {exc}") from None
        with self._lock:
            self._dynamic = _TopicEntry(0, props, None, now)
            changed = defaults != self.defaults
            self.defaults = defaults
            topics = {topic for topic, _ in self._logs} if changed else set()
        for topic in topics:  # every open log takes its topic's config over the new defaults
            try:
                partitions, overrides = self._topic(topic)
            except (UnknownTopicOrPartitionError, InvalidTopicError):
                continue  # deleted meanwhile
            with self._lock:
                changes = self._config_changes(topic, partitions, self._config_for(overrides))
            self._apply_changes(changes)

    def _overrides(self, config: Mapping[str, Any]) -> dict[str, str]:
        """Validate overrides against the defaults; return them by Kafka names as strings."""
        plain = {k: v for k, v in config.items() if "." not in k}
        dotted = {k: v for k, v in config.items() if "." in k}
        merged = self.defaults.replace(**plain)
        if dotted:
            merged = LogConfig.from_kafka({**merged.to_kafka(), **{k: str(v) for k, v in dotted.items()}})
        kafka = merged.to_kafka()
        names = {_FIELD_TO_KAFKA[k] for k in plain} | set(dotted)
        return {name: kafka[name] for name in names}

    def delete_topic(self, name: str) -> None:
        """Delete a topic and all of its records.

        Raises:
            UnknownTopicOrPartitionError: no such topic.
            LogLockedError: another process has one of its partitions open.

        Durable on return; a crash half-way leaves directories named ``*-delete``, or partition
        directories no topic file counts, that the next open of the store removes (and that
        creating the topic again sets aside). Every ``<name>-<n>`` directory goes, whatever
        count this process had cached: the count and the directories are read under the
        metadata lock, during which no process opens a partition.
        """
        validate_topic_name(name)
        self._check_open()
        with self._metadata_lock():  # no partition is opened meanwhile, by any thread or process
            # The count and the directories as they are now: another process may have grown
            # the topic a moment ago, and a directory past the count (a crash) goes too.
            found = self._read_topic(name)
            if found is None:
                with self._lock:
                    self._topics_cache.pop(name, None)
                    self._forget_id(name)
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist in {self.root}")
            directories = self._partition_dirs(name)
            numbers = set(range(found.partitions)) | set(directories)
            held = []
            try:
                with self._lock:
                    closing = [self._logs.pop(key) for key in list(self._logs) if key[0] == name]
                for log in closing:
                    if self._cleaner is not None:
                        self._cleaner.remove(log)
                    if self._remote is not None:
                        self._remote.detach(log)
                    log.close()
                for p, directory in sorted(directories.items()):
                    lock = _FileLock(os.path.join(self.root, directory, LOCK_FILE), blocking=False)
                    if not lock.acquired:
                        raise LogLockedError(f"cannot delete topic {name!r}: partition {p} is open in another process")
                    held.append(lock)
                _fileio.ops.unlink(self._topic_file(name))
                _fileio.ops.fsync_dir(os.path.join(self.root, TOPICS_DIR))
                with self._lock:
                    self._topics_cache.pop(name, None)
                    self._forget_id(name)
                # A crash from here on leaves directories no topic file counts: the next open
                # of the store sets them aside (_set_aside_orphans), as does create_topic.
                doomed = []
                for p, directory in sorted(directories.items()):
                    # Kafka's <topic>-<p>.<id>-delete can exceed NAME_MAX for long topic
                    # names; ".<id>-delete" never does, nor can it look like a partition.
                    target = os.path.join(self.root, f".{uuid.uuid4().hex}{DELETE_SUFFIX}")
                    _fileio.ops.rename(os.path.join(self.root, directory), target)
                    doomed.append(target)
                _fileio.ops.fsync_dir(self.root)
            finally:
                for lock in held:
                    lock.release()
            for key in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, CLEANER_OFFSET_CHECKPOINT):
                OffsetCheckpoints(self.root, key).update({(name, p): None for p in numbers})
            self._remove_trees(doomed)
            manager = self._remote_manager_locked() if self._config_for(found.overrides).remote_storage_enable \
                else None
        logger.info("%s: deleted topic %s", self.root, name)
        if manager is not None and found.topic_id is not None:
            # The remote segments go after the local ones, without the metadata lock (an object
            # store may be slow); what fails now is retried by the remote log manager's rounds.
            manager.delete_partitions(found.topic_id, name, sorted(numbers))

    def topics(self, internal: bool = False) -> list[str]:
        """Names of the topics, sorted (internal ones like ``__consumer_offsets`` only when asked)."""
        self._check_open()
        names = []
        for name in _fileio.ops.listdir(os.path.join(self.root, TOPICS_DIR)):
            if LEGAL_TOPIC_NAME.fullmatch(name) and name not in (".", "..") and (internal or not is_internal_topic(name)):
                names.append(name)
        return sorted(names)

    def describe(self, name: str) -> TopicDescription:
        """The topic's partition count, effective config and persisted overrides."""
        partitions, overrides = self._topic(name)
        return TopicDescription(name, partitions, self._config_for(overrides), dict(overrides),
                                internal=is_internal_topic(name), topic_id=self.topic_id(name))

    def _config_for(self, overrides: Mapping[str, str]) -> LogConfig:
        if not overrides:
            return self.defaults
        return LogConfig.from_kafka({**self.defaults.to_kafka(), **overrides})

    def partitions_for(self, name: str) -> int:
        """Number of partitions of a topic."""
        return self._topic(name)[0]

    def partition(self, topic: str, partition: int) -> Log:
        """The Log of one partition, opened on first use and owned by the store (do not close it).

        Raises:
            UnknownTopicOrPartitionError: no such topic or partition.
        """
        if partition.__class__ is not int:
            raise UnknownTopicOrPartitionError(f"partition must be an int, got {partition!r}")
        key = (topic, partition)
        log = self._logs.get(key)
        if log is not None and not log.closed:
            return log
        partitions, _ = self._topic(topic)
        if partition >= partitions:  # grown by another process since this one looked?
            partitions, _ = self._topic(topic, fresh=True)
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < partitions:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has partitions 0..{partitions - 1}; there is no partition {partition!r}")
        with self._metadata_lock():
            return self._open_partition(topic, partition)

    def opened(self, topic: str, partition: int) -> Log | None:
        """The Log of one partition when the store has it open, else None (nothing is opened
        or read: for a caller that must not wait, such as a server's network loop; it then
        takes :meth:`partition`). Thread-safe."""
        log = self._logs.get((topic, partition))
        return log if log is not None and not log.closed else None

    def _open_partition(self, topic: str, partition: int) -> Log:
        """Open one partition (with the metadata lock held) from one read of its topic file,
        made now: its count, config and id together.

        Invariant: a partition is opened, and its ``partition.metadata`` written, only under
        the metadata lock, which every creation, growth and deletion of a topic holds
        throughout. So no process opens a partition of a topic deleted meanwhile (making its
        directory again) or writes a deleted topic's id into a re-created one's directory.
        The store's lock is not held while the log opens (recovery may take long)."""
        key = (topic, partition)
        with self._lock:
            self._check_open()
            log = self._logs.get(key)
        if log is not None and not log.closed:
            return log
        found = self._read_topic(topic)
        if found is None or found.topic_id is None:
            with self._lock:
                self._topics_cache.pop(topic, None)
                self._forget_id(topic)
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist in {self.root}")
        with self._lock:  # (the cache is left to _topic: it applies a change to the open logs)
            self._remember_id(topic, found.topic_id)
        if not 0 <= partition < found.partitions:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has partitions 0..{found.partitions - 1}; there is no partition {partition!r}")
        log = Log(os.path.join(self.root, f"{topic}-{partition}"), self._config_for(found.overrides),
                  shared=self.shared, timers=False, notify_page=self.notify_page)
        try:
            _check_partition_metadata(log.path, topic, found.topic_id)
            with self._lock:
                self._check_open()
                self._logs[key] = log
        except BaseException:
            log.close()
            raise
        if self._cleaner is not None and log.config.compacted:
            self._cleaner.add(log)
        if log.config.remote_storage_enable and not is_internal_topic(topic):
            manager = self._remote_manager_locked()
            if manager is not None:
                manager.attach(log, found.topic_id)
            else:
                logger.warning("%s: %s-%d enables remote storage but this store was opened without "
                               "remote_storage: its records below the local segments cannot be read here",
                               self.root, topic, partition)
        return log

    # ------------------------------------------------------------------ tiered storage
    def check_remote_storage(self, topic: str) -> None:
        """Check that ``topic`` may enable remote storage (the store has an object store)
        without creating anything (a Kafka server's validate-only CreateTopics). Thread-safe.

        Raises:
            InvalidConfigError: the store was opened without ``remote_storage``.
        """
        self._check_remote_storage(topic)

    def _check_remote_storage(self, topic: str) -> None:
        if self._remote_spec[0] is None:
            raise InvalidConfigError(f"topic {topic!r}: remote.storage.enable needs a store opened with "
                                     f"remote_storage (an object store URL such as file:///path or s3://bucket)")

    @property
    def remote_log_manager(self) -> Any:
        """The store's :class:`~logstore.tiered.manager.RemoteLogManager` (tiered storage),
        made on first use (with the ``__remote_log_metadata`` topic); None for a store opened
        without ``remote_storage``. Thread-safe."""
        if self._remote is not None or self._remote_spec[0] is None:
            return self._remote
        self._check_open()
        with self._metadata_lock():
            return self._remote_manager_locked()

    def _remote_manager_locked(self) -> Any:
        """The RemoteLogManager, made now if it is not (with the metadata lock held: the
        ``__remote_log_metadata`` topic is created and opened under it)."""
        with self._lock:
            if self._remote is not None:
                return self._remote
        storage, options, rlmm_factory, interval_ms, fetch_wait_ms, cache_bytes = self._remote_spec
        if storage is None:
            return None
        if isinstance(storage, str):  # remembered for the next opens and the read-only readers
            text = remote_storage_text(storage, options)
            path = os.path.join(self.root, REMOTE_STORAGE_FILE)
            try:
                current = _fileio.ops.read_file(path)
            except FileNotFoundError:
                current = None
            if current != text:
                _fileio.ops.write_file_atomic(path, text)
        from ..tiered.manager import RemoteLogManager, RemoteLogManagerConfig
        from ..tiered.rlmm import TopicBasedRemoteLogMetadataManager
        from ..tiered.storage import RemoteStorageManager

        config = RemoteLogManagerConfig(task_interval_ms=interval_ms, fetch_max_wait_ms=fetch_wait_ms,
                                        index_cache_size_bytes=cache_bytes, broker_id=self._remote_broker_id)
        name = REMOTE_LOG_METADATA_TOPIC
        if self._read_topic(name) is None:
            self._write_topic(name, 1, self._new_topic_id(name),
                              self._overrides({"retention_ms": -1, "retention_bytes": -1,
                                               "remote_storage_enable": False}))
            _fileio.ops.fsync_dir(self.root)
        metadata_log = self._open_partition(name, 0)
        rlmm = rlmm_factory(metadata_log) if rlmm_factory is not None else \
            TopicBasedRemoteLogMetadataManager(metadata_log)
        rsm = storage if isinstance(storage, RemoteStorageManager) else \
            RemoteStorageManager.from_url(str(storage), options)
        manager = RemoteLogManager(rsm, rlmm, config, name=self.root, may_run=self._lead_remote,
                                   before_round=self._open_tiered, leads=self._remote_leads,
                                   # (on a replica set a node may not know a topic yet that the
                                   # set has: only a single store may take a missing topic file
                                   # for a deleted topic; the set deletes no topics)
                                   partition_exists=self._remote_partition_exists if self._remote_leads is None
                                   else None)
        with self._lock:
            self._remote = manager
        if self._maintenance:
            manager.start()
        return manager

    def _remote_partition_exists(self, tp: Any) -> bool:
        """Whether the remote tier's partition ``tp`` (a TopicIdPartition) is one of a topic of
        this store, by name and id (the remote log manager deletes the remote segments of the
        others). A topic file that cannot be read counts as there."""
        try:
            found = self._read_topic(tp.topic)
        except (LogstoreError, OSError, ValueError):
            return True
        return found is not None and found.topic_id == tp.topic_id and tp.partition < found.partitions

    def _lead_remote(self) -> bool:
        """Whether this process is the one of a shared store that copies and expires remote
        segments (it holds ``.lock-remote-log-manager``; asked again each round until it does)."""
        with self._lock:
            if self._remote_lead_fd >= 0:
                return True
            if self._closed:
                return False
            ops = _fileio.ops
            fd = ops.open(os.path.join(self.root, REMOTE_LEAD_LOCK), os.O_RDWR | os.O_CREAT)
            if ops.lock(fd, blocking=False):
                self._remote_lead_fd = fd
                return True
            ops.close(fd)
            return False

    def logs(self) -> Iterator[tuple[str, int, Log]]:
        """Every partition of every topic (internal ones included), opening them as needed."""
        for topic in self.topics(internal=True):
            try:
                count = self.partitions_for(topic)
            except UnknownTopicOrPartitionError:
                continue  # deleted meanwhile
            for p in range(count):
                yield topic, p, self.partition(topic, p)

    def metrics(self) -> dict[str, Any]:
        """Every partition's :meth:`Log.metrics` as ``{name: {(topic, partition): value}}``,
        plus the store-wide cleaner metrics (Kafka's max-dirty-percent,
        uncleanable-partitions-count and max-clean-time-secs). Names and meanings are listed in
        :mod:`logstore.metrics`; ``logstore.metrics.prometheus_text(store.metrics())`` renders
        them for Prometheus. Opens every partition. Thread-safe."""
        out: dict[str, Any] = {}
        dirty = uncleanable = 0
        clean_time = 0.0
        for topic, p, log in list(self.logs()):
            try:
                values = log.metrics()
            except LogClosedError:
                continue
            for name, value in values.items():
                out.setdefault(name, {})[(topic, p)] = value
            if log.config.compacted:
                state = log.cleaner_state
                uncleanable += state.uncleanable_reason is not None
                dirty = max(dirty, int(values["logstore:type=LogCleaner,name=DirtyRatio"] * 100))
                if state.last_report is not None:
                    clean_time = max(clean_time, state.last_report.duration_s)
        out["kafka.log:type=LogCleaner,name=max-dirty-percent"] = dirty
        out["kafka.log:type=LogCleanerManager,name=uncleanable-partitions-count"] = uncleanable
        out["kafka.log:type=LogCleaner,name=max-clean-time-secs"] = clean_time
        if self._remote is not None:
            for name, value in self._remote.metrics().items():
                out[f"kafka.server:type=BrokerTopicMetrics,name={name}"] = value
            for name, values in self._remote.partition_metrics().items():
                out[f"kafka.log:type=RemoteLog,name={name}"] = values
        return out

    # ------------------------------------------------------------------ Arrow
    def iter_arrow(self, topic: str, partitions: Sequence[int] | None = None, start: int | Mapping[int, int] | None = None,
                   end: int | Mapping[int, int] | None = None, start_timestamp: int | None = None,
                   end_timestamp: int | None = None, columns: Sequence[str] | None = None,
                   views: bool = False) -> Iterator[Any]:
        """A topic's records as ``pyarrow.RecordBatch`` es, partition after partition
        (default: every partition, in order), each through :meth:`Log.iter_arrow` (same schema,
        columns and guarantees; ``views`` as there: keys and values as ``binary_view`` columns
        pointing into the segment files instead of copies).

        Per partition the records run from ``start`` (an offset, or {partition: offset};
        default: the log start) up to ``end`` (exclusive; default: the log end). Timestamps
        narrow that as Kafka's ListOffsets does: from the first offset whose timestamp is at
        least ``start_timestamp``, up to the first whose timestamp is at least
        ``end_timestamp`` (milliseconds since the epoch). Needs pyarrow. Thread-safe.

        Raises:
            UnknownTopicOrPartitionError: no such topic or partition.
            OffsetOutOfRangeError: a start outside a partition's log.
            ValueError: an unknown column name.
        """
        count = self.partitions_for(topic)
        chosen = list(range(count)) if partitions is None else [int(p) for p in partitions]
        readers = []  # every partition and range checked before anything is read
        for p in chosen:
            log = self.partition(topic, p)
            first = start.get(p) if isinstance(start, Mapping) else start
            last = end.get(p) if isinstance(end, Mapping) else end
            if start_timestamp is not None:
                at = log.offset_for_timestamp(start_timestamp)
                first = max(first if first is not None else log.log_start_offset, at if at is not None else log.log_end_offset)
            if end_timestamp is not None:
                at = log.offset_for_timestamp(end_timestamp)
                if at is not None:
                    last = at if last is None else min(last, at)
            if first is not None and last is not None and last <= first:
                continue
            readers.append(log.iter_arrow(first, last, columns, views=views))
        return itertools.chain.from_iterable(readers)

    def read_arrow(self, topic: str, partitions: Sequence[int] | None = None, start: int | Mapping[int, int] | None = None,
                   end: int | Mapping[int, int] | None = None, start_timestamp: int | None = None,
                   end_timestamp: int | None = None, columns: Sequence[str] | None = None,
                   views: bool = False) -> Any:
        """:meth:`iter_arrow`'s batches as one ``pyarrow.Table`` (the same arguments); the
        table holds every record asked for in memory (with ``views``, its long keys and values
        as maps of the segment files, see :meth:`Log.iter_arrow`). Query it with pandas
        (``to_pandas()``), polars (``polars.from_arrow``) or DuckDB (by the variable's name)."""
        batches = list(self.iter_arrow(topic, partitions, start, end, start_timestamp, end_timestamp, columns, views))
        return arrow_table(batches, columns, views)

    # ------------------------------------------------------------------ clients
    # The client wing sits on the floor above the store: these two factories import it when
    # called (as pandas' accessors import their implementation), so that the store's module
    # does not depend on it (tests/unit/test_architecture.py lists them in LATE_IMPORTS).
    def producer(self, **options: Any) -> Any:
        """A :class:`logstore.Producer` for this store (see its arguments). Closing the store
        closes it first (writing what it holds)."""
        from ..client.producer import Producer

        return self._track(Producer(self, **options))

    def consumer(self, group: str, topics: str | list[str], **options: Any) -> Any:
        """A :class:`logstore.Consumer` in ``group`` reading ``topics`` (see its arguments).
        Closing the store closes it first (committing, with auto-commit)."""
        from ..client.consumer import Consumer

        return self._track(Consumer(self, group, topics, **options))

    def _track(self, client: Any) -> Any:
        with self._lock:
            if self._closing:
                client.close()
            self._check_open()
            self._clients.add(client)
        return client

    # ------------------------------------------------------------------ waiting
    def wait(self, seen: int, timeout: float | None) -> None:
        """Sleep until any partition of the store gets an append after the notification counter
        read ``seen`` (see :meth:`notification`), or ``timeout`` seconds pass."""
        page = self.notify_page
        lib.ls_notify_enter(page)
        try:
            lib.ls_notify_wait(page, seen, -1 if timeout is None else max(1, int(timeout * 1e6)))
        finally:
            lib.ls_notify_leave(page)

    def wait_until_done(self, attempts: Generator[tuple[int, float], None, T]) -> T:
        """Run a poll loop written as a generator that yields (notification counter, seconds)
        whenever it must wait: sleep on the store's notification page each time; return what
        the generator returns. (Consumer.poll and Queue.get are such loops.)"""
        try:
            while True:
                seen, wait = next(attempts)
                self.wait(seen, wait)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def await_until_done(self, attempts: Generator[tuple[int, float], None, T], longest: float = 0.5) -> T:
        """:meth:`wait_until_done` for asyncio: each wait runs in the default executor (at most
        ``longest`` seconds, so that a cancelled caller leaves no long-sleeping thread)."""
        import asyncio  # loaded by whoever runs this coroutine; not by importing the store

        loop = asyncio.get_running_loop()
        try:
            while True:
                seen, wait = next(attempts)
                await loop.run_in_executor(None, self.wait, seen, min(wait, longest))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def notification(self) -> int:
        """The store's notification counter: read it, check for data, then :meth:`wait` on it."""
        return int(lib.ls_notify_counter(self.notify_page))

    # ------------------------------------------------------------------ maintenance
    def run_maintenance(self, now_ms: int | None = None) -> dict[str, int]:
        """Run every maintenance task once, now: retention on every partition, due flushes and
        file deletions, and one cleaner pass per compacted log that needs it. Returns counts
        (segments_deleted, flushes, logs_cleaned). Thread-safe."""
        self._check_open()
        self._look_at_open_topics()
        deleted = flushes = cleaned = 0
        for _, _, log in list(self.logs()):
            try:
                deleted += log.enforce_retention(now_ms)
                flushes += int(log.run_due_tasks())
            except LogClosedError:
                continue
        if self._cleaner is not None:
            while self._cleaner.run_once(now_ms) is not None:
                cleaned += 1
        out = {"segments_deleted": deleted, "flushes": flushes, "logs_cleaned": cleaned}
        self._start_remote_if_tiered()
        if self._remote is not None:
            done = self._remote.run_once(now_ms)
            out.update(remote_segments_copied=done["copied"], remote_segments_deleted=done["deleted"],
                       remote_errors=done["errors"])
        return out

    def _look_at_open_topics(self) -> None:
        """Check the files of the topics with open logs and the dynamic defaults (at most every
        TOPIC_MAX_AGE_S each): a config another process altered reaches this process's logs
        here."""
        self._read_dynamic_defaults()
        with self._lock:
            names = {topic for topic, _ in self._logs}
        for name in names:
            try:
                self._topic(name)
            except (UnknownTopicOrPartitionError, InvalidTopicError):
                continue  # deleted meanwhile
        with self._lock:
            pending, self._attach_pending = self._attach_pending, []
        if pending and self.remote_log_manager is not None:  # (a topic another process tiered)
            for log, name in pending:
                if not log.closed and log.remote_tier is None:
                    try:
                        self._remote.attach(log, self.topic_id(name))
                    except (LogClosedError, UnknownTopicOrPartitionError):
                        continue

    def _start_remote_if_tiered(self) -> None:
        """Make the remote log manager when the store has tiered anything before (its
        ``__remote_log_metadata`` topic exists), so that its rounds finish what earlier runs
        left (a deleted topic's remote segments) even before a tiered partition is opened."""
        if self._remote is None and self._remote_spec[0] is not None and \
                self._read_topic(REMOTE_LOG_METADATA_TOPIC) is not None:
            self.remote_log_manager  # noqa: B018 - made (and started) on first use

    def _open_tiered(self) -> None:
        """Open (and so attach) every partition of every topic that enables remote storage: the
        process that copies tiers them all, whoever writes them (the manager's round hook)."""
        if self._closed or self._closing:
            return
        try:
            topics = self.topics()
        except LogClosedError:
            return  # the store closes (its manager's last round)
        for topic in topics:
            try:
                partitions, overrides = self._topic(topic)
                if self._config_for(overrides).remote_storage_enable:
                    for p in range(partitions):
                        self.partition(topic, p)
            except (UnknownTopicOrPartitionError, InvalidTopicError, LogClosedError):
                continue  # deleted meanwhile, or the store closes

    def _tick_seconds(self) -> float:
        with self._lock:
            flush_ms = [log.config.flush_ms for log in self._logs.values() if log.config.flush_ms is not None]
        intervals = [1.0, self.retention_check_interval_ms / 1000.0, self.cleaner_backoff_ms / 1000.0]
        return max(0.01, min(intervals + [ms / 1000.0 for ms in flush_ms]))

    def _run(self) -> None:
        next_retention = time.monotonic() + self.retention_check_interval_ms / 1000.0
        next_clean = time.monotonic() + self.cleaner_backoff_ms / 1000.0
        while not self._stop.wait(self._tick_seconds()):
            now = time.monotonic()
            try:
                self._look_at_open_topics()
                with self._lock:
                    logs = list(self._logs.values())
                for log in logs:
                    try:
                        log.run_due_tasks()
                    except LogClosedError:
                        pass
                if now >= next_retention:
                    next_retention = now + self.retention_check_interval_ms / 1000.0
                    for _, _, log in list(self.logs()):
                        try:
                            log.enforce_retention()
                        except LogClosedError:
                            pass
                    self._start_remote_if_tiered()
                if now >= next_clean and self._cleaner is not None:
                    next_clean = now + self.cleaner_backoff_ms / 1000.0
                    self._cleaner.run_once()
            except LogClosedError:
                return
            except Exception:  # noqa: BLE001 - the scheduler must outlive one failed task
                logger.exception("%s: maintenance task failed", self.root)

    # ------------------------------------------------------------------ closing
    def add_closer(self, close: Any) -> None:
        """Call ``close()`` when the store closes, after its producers and consumers (for the
        client layer's services). Thread-safe."""
        with self._lock:
            self._closers.append(close)

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._closed

    def close(self) -> None:
        """Close the producers and consumers made by this store (they write and commit what they
        hold), stop the scheduler and close every partition (each as Log.close). Idempotent."""
        with self._lock:
            if self._closed or self._closing:
                return
            self._closing = True
        errors = []
        for client in list(self._clients):
            try:
                client.close()
            except Exception as exc:  # noqa: BLE001 - close the rest, then report
                errors.append(exc)
        for closer in self._closers:  # services of the clients (a group coordinator): after them
            try:
                closer()
            except Exception as exc:  # noqa: BLE001 - close the rest, then report
                errors.append(exc)
        with self._lock:
            self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self._remote is not None:
            try:
                self._remote.close()  # its thread stops before the logs close
            except Exception as exc:  # noqa: BLE001 - close the rest, then report
                errors.append(exc)
        if self._remote_lead_fd >= 0:
            _fileio.ops.close(self._remote_lead_fd)
            self._remote_lead_fd = -1
        with self._lock:
            logs = list(self._logs.values())
            self._logs.clear()
        for log in logs:
            try:
                log.close()
            except Exception as exc:  # noqa: BLE001 - close the others, then report
                errors.append(exc)
        if self._notify_mm is not None:
            lib.ls_notify(self.notify_page)
            ffi.release(self.notify_page)
            self._notify_mm.close()
            self._notify_mm = None
        _fileio.ops.close(self._lock_fd)
        if errors:
            raise errors[0]

    def __repr__(self) -> str:
        return f"LogStore({self.root!r}{', closed' if self._closed else ''})"


class _TopicEntry:
    """A topic file (or ``.topic-defaults``) as this process last read it: its count, overrides
    and topic id.

    Invariant: a change is seen by reading the file and comparing what it says, never by the
    file's identity. The file is replaced by a rename, and ext4 hands the freed inode to the
    next replacement, so two rewrites in a row can put a changed file back on the cached
    (device, inode); its size and mtime can match too (the kernel's file times tick every few
    milliseconds, and ``retention.ms=1000`` and ``=2000`` are the same size). A topic file is a
    few hundred bytes: reading it once a second per open topic costs less than a stat's doubt.
    """

    __slots__ = ("partitions", "overrides", "topic_id", "checked")

    def __init__(self, partitions: int, overrides: dict[str, str], topic_id: uuid.UUID | None,
                 checked: float) -> None:
        self.partitions = partitions
        self.overrides = overrides
        self.topic_id = topic_id
        #: when the file was last read (monotonic seconds)
        self.checked = checked

    def same_file(self, other: "_TopicEntry") -> bool:
        """True when ``other`` says what this entry says (count, overrides and id)."""
        return (self.partitions == other.partitions and self.overrides == other.overrides
                and self.topic_id == other.topic_id)


class _FileLock:
    """An flock on a lock file, blocking unless told otherwise (``acquired`` says if it got it)."""

    def __init__(self, path: str, blocking: bool = True) -> None:
        self._fd = _fileio.ops.open(path, os.O_RDWR | os.O_CREAT)
        self.acquired = _fileio.ops.lock(self._fd, blocking=blocking)
        if not self.acquired:
            _fileio.ops.close(self._fd)
            self._fd = -1

    def release(self) -> None:
        if self._fd >= 0:
            _fileio.ops.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "_FileLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _no_remote_default(enabled: bool) -> None:
    """remote.storage.enable is a topic's own setting: as a store default, a topic could lose it
    (and its older segments with it) when the default changes."""
    if enabled:
        raise InvalidConfigError("remote.storage.enable is set per topic (create_topic, alter_topic_config), "
                                 "not as a store default: a topic must not lose it when a default changes")


def _properties_text(props: Mapping[str, str]) -> bytes:
    """Java properties, one ``key=value`` line each, sorted."""
    return "".join(f"{k}={v}\n" for k, v in sorted(props.items())).encode()



def _check_partition_metadata(directory: str, topic: str, topic_id: uuid.UUID) -> None:
    """Write the partition directory's ``partition.metadata`` when it has none (durable); else
    check it names ``topic_id``.

    Raises:
        InconsistentTopicIdError: it names another topic id.
        LogstoreError: it is malformed.
    """
    found = read_partition_metadata(directory)
    if found is None:
        write_partition_metadata(directory, topic_id)
    elif found != topic_id:
        raise InconsistentTopicIdError(
            f"{directory}: partition.metadata names topic id {topic_id_text(found)}, topic {topic!r} has id "
            f"{topic_id_text(topic_id)} (a directory of another topic of that name?): not opened")


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidConfigError(f"{name} must be a positive int (ms), got {value!r}")
    return value
