"""Kafka log directories: finding the partitions of a directory that Apache Kafka wrote.

A broker's ``log.dirs`` entry holds the same partition directories as a logstore data directory
but no ``.topics/``: Kafka keeps its topics' partition counts and settings in ZooKeeper or in its
KRaft metadata log, not in the log directory. This module reads such a directory — it never
writes — and tells which of its entries are partitions that logstore can adopt as topics:

::

    <log dir>/
        meta.properties                        Kafka's (version 0 or 1); logstore accepts it
        .lock, .kafka_cleanshutdown            files: ignored
        recovery-point-offset-checkpoint ...   Kafka's checkpoint files: logstore's format (§6)
        orders-0/, orders-2/                   adopted: topic "orders", partitions 0..2
        __consumer_offsets-0/ ...              adopted as the internal topic only if compatible
        orders-1.<32 hex>-delete/              skipped: a deleted partition Kafka had not removed
        orders-1.<32 hex>-future/              skipped: a replica Kafka was moving between log dirs
        orders-1.<32 hex>-stray/               skipped: a replica Kafka found it should not hold
        __cluster_metadata-0/                  skipped: Kafka's KRaft metadata log, not a topic
        remote-log-index-cache/                skipped: Kafka's tiered-storage cache
        bad name-0/, orders-007/               skipped: not a legal <topic>-<partition> name

Rules, as :func:`scan` applies them:

* A directory named ``<topic>-<n>`` is a partition iff ``<topic>`` is a legal topic name
  (:func:`validate_topic_name`: Kafka's rule, which a store also applies to the topics it
  creates) and ``<n>`` is a partition number written the way Kafka writes it (decimal, no
  sign, no leading zero) below 1000000, logstore's limit.
* A topic's partition count is its highest partition number + 1. Partition numbers are kept,
  never renumbered: they are the partitions' identity (Kafka's key partitioner and committed
  offsets name them). A gap — partitions held by another broker of the cluster — is adopted as
  empty partitions, and reported in :attr:`AdoptedTopic.missing`.
* Adopted topics have no config overrides (Kafka's topic settings are not in the log
  directory): the store's defaults apply, including ``retention.ms`` of 7 days. Open the store
  with ``retention_ms=-1`` to keep old data, or let no maintenance run.
* ``__consumer_offsets`` is adopted as the internal offsets topic (with the settings logstore
  gives it) only if logstore's consumer groups can share it: it has exactly one partition, and
  every batch in it holds records whose offset commit keys and values logstore decodes (a
  transactional commit's batches and their markers are applied as Kafka's coordinator applies
  them, see :mod:`logstore.groups.offsets`) (:mod:`logstore.groups.offsets`; Kafka's group metadata
  records are taken up by the store's group coordinator when it reads them, see
  :mod:`logstore.groups.metadata`, and other record types are ignored). Kafka's default topic has 50
  partitions and places a group's commits in partition ``hash(group) % 50``, while logstore
  keeps every group in partition 0, so the default is not compatible: :func:`scan` skips it
  with a warning (see :attr:`LogDirScan.foreign_offsets`) and a :class:`~logstore.LogStore`
  moves it aside (:data:`OFFSETS_ASIDE_DIR`) so that its own consumer groups start clean.

Thread-safety: the functions share no state. They read a directory that may change meanwhile;
a partition directory created after the listing is simply not seen.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Mapping

from .. import _fileio
from ..checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
)
from ..errors import CorruptRecordError, InconsistentTopicIdError, InvalidTopicError, LogLockedError, LogstoreError
from .topicids import read_partition_metadata, topic_id_text

__all__ = ["is_internal_topic", "AdoptedTopic", "SkippedDir", "LogDirScan", "scan", "looks_like_log_dir", "parse_partition_dir",
           "validate_topic_name", "OFFSETS_ASIDE_DIR", "OFFSETS_TOPIC_OVERRIDES", "adopt", "refuse_kafka_broker"]

logger = logging.getLogger("logstore.store.kafkadirs")

#: The lock file a Kafka broker holds in each of its log directories (a Java FileLock).
BROKER_LOCK_FILE = ".lock"

#: Where a LogStore moves a Kafka ``__consumer_offsets`` its consumer groups cannot share.
OFFSETS_ASIDE_DIR = ".kafka-consumer-offsets"
#: The topic settings an adopted ``__consumer_offsets`` gets (logstore's offsets topic settings
#: under Kafka's names; see :data:`logstore.groups.offsets.OFFSETS_TOPIC_CONFIG`).
OFFSETS_TOPIC_OVERRIDES: Mapping[str, str] = {"cleanup.policy": "compact", "segment.bytes": str(100 * 1024 * 1024),
                                              "min.cleanable.dirty.ratio": "0.5"}
MAX_PARTITIONS = 1_000_000
MAX_TOPIC_LENGTH = 249
#: the characters of a legal topic name (Kafka's Topic.LEGAL_CHARS), one or more
LEGAL_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
_KAFKA_FILES = (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, CLEANER_OFFSET_CHECKPOINT,
                REPLICATION_OFFSET_CHECKPOINT, "meta.properties", ".kafka_cleanshutdown")
_PARTITION_DIR = re.compile(r"^(.+)-([0-9]+)$")
_KAFKA_SUFFIXED = re.compile(r"^.+-[0-9]+\.[0-9a-zA-Z]+-(delete|future|stray)$")
_SUFFIX_REASONS = {
    "delete": "a deleted partition that Kafka had not removed yet (Kafka's <topic>-<n>.<id>-delete)",
    "future": "a replica Kafka was moving between log directories (Kafka's <topic>-<n>.<id>-future); "
              "the current replica is in another log directory",
    "stray": "a replica Kafka found it should no longer hold (Kafka's <topic>-<n>.<id>-stray)",
}
_SPECIAL_DIRS = {
    "remote-log-index-cache": "Kafka's tiered-storage index cache, not a partition",
}
_METADATA_TOPIC = "__cluster_metadata"
_OFFSETS_TOPIC = "__consumer_offsets"


@dataclass(frozen=True)
class AdoptedTopic:
    """A topic made of the partition directories :func:`scan` found."""

    name: str
    #: highest partition number found + 1
    partitions: int
    #: partition numbers that have a directory, ascending
    present: tuple[int, ...]
    #: topic settings under Kafka's names (empty, except for an adopted ``__consumer_offsets``)
    overrides: Mapping[str, str] = field(default_factory=dict)
    #: the topic id of its partitions' ``partition.metadata`` (KIP-516), None when they have none
    topic_id: uuid.UUID | None = None

    @property
    def missing(self) -> tuple[int, ...]:
        """Partition numbers below the count without a directory (adopted as empty)."""
        have = set(self.present)
        return tuple(p for p in range(self.partitions) if p not in have)


@dataclass(frozen=True)
class SkippedDir:
    """A directory of the log directory that is not adopted, and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class LogDirScan:
    """What :func:`scan` found: the topics to adopt and the directories it skipped."""

    topics: dict[str, AdoptedTopic]
    skipped: tuple[SkippedDir, ...]
    #: names of the ``__consumer_offsets-<n>`` directories that are not compatible (see the
    #: module docstring); empty when there are none or they were adopted
    foreign_offsets: tuple[str, ...] = ()


def is_internal_topic(name: str) -> bool:
    """Whether ``name`` is an internal topic (``__consumer_offsets``, ``__transaction_state``,
    a replica set's ``__acls``): every name starting with ``__``, the names the store reserves
    for its own topics (``LogStore.create_topic``'s ``internal``). Pure."""
    return name.startswith("__")


def validate_topic_name(name: Any) -> str:
    """Return ``name`` if it is a legal Kafka topic name, else raise InvalidTopicError.

    Kafka's rules: 1 to 249 characters from ``[a-zA-Z0-9._-]``, and not ``.`` or ``..``. They
    also keep every name a plain file name, so no name can reach outside the store's root.
    """
    if not isinstance(name, str):
        raise InvalidTopicError(f"topic name must be a str, got {type(name).__name__}")
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(f"topic name is {len(name)} characters long; the limit is {MAX_TOPIC_LENGTH}")
    if not LEGAL_TOPIC_NAME.fullmatch(name):
        bad = sorted({c for c in name if not re.match(r"[a-zA-Z0-9._-]", c)})
        raise InvalidTopicError(
            f"topic name {name!r} contains {''.join(bad)!r}; legal characters are ASCII letters, "
            "digits, '.', '_' and '-'")
    return name


def parse_partition_dir(name: str) -> tuple[str, int] | str:
    """``(topic, partition)`` of a partition directory name, or the reason it is not one.

    >>> parse_partition_dir("orders-12")
    ('orders', 12)
    >>> parse_partition_dir("orders-012")
    "partition number '012' is not written as Kafka writes it (decimal, no leading zero)"
    """
    suffixed = _KAFKA_SUFFIXED.match(name)
    if suffixed:
        return _SUFFIX_REASONS[suffixed.group(1)]
    if name in _SPECIAL_DIRS:
        return _SPECIAL_DIRS[name]
    m = _PARTITION_DIR.match(name)
    if not m:
        return "not a partition directory (<topic>-<partition>)"
    topic, number = m.group(1), m.group(2)
    if str(int(number)) != number:
        return f"partition number {number!r} is not written as Kafka writes it (decimal, no leading zero)"
    if int(number) >= MAX_PARTITIONS:
        return f"partition number {number} is not below {MAX_PARTITIONS}, logstore's limit"
    if topic == _METADATA_TOPIC:
        return "Kafka's KRaft metadata log, not a topic"
    try:
        validate_topic_name(topic)
    except LogstoreError as exc:
        return str(exc)
    return topic, int(number)


def looks_like_log_dir(root: str, files_only: bool = False) -> bool:
    """True when ``root`` holds one of Kafka's log-directory files (``meta.properties``, a
    checkpoint file, ``.kafka_cleanshutdown``) or, unless ``files_only``, a partition
    directory. Reads only."""
    try:
        names = _fileio.ops.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return False
    if any(name in _KAFKA_FILES for name in names):
        return True
    return not files_only and any(isinstance(parse_partition_dir(name), tuple)
                                  and os.path.isdir(os.path.join(root, name)) for name in names)


def scan(root: str, quiet: bool = False) -> LogDirScan:
    """Classify the directories of ``root`` (see the module docstring). Reads only; logs each
    skipped directory (INFO), each gap and an incompatible ``__consumer_offsets`` (WARNING),
    unless ``quiet``.

    Raises:
        LogstoreError: ``root`` is not a directory.
    """
    try:
        names = sorted(_fileio.ops.listdir(root))
    except (FileNotFoundError, NotADirectoryError):
        raise LogstoreError(f"{root}: no such directory") from None
    found: dict[str, list[int]] = {}
    skipped = []
    for name in names:
        if name.startswith(".") or not os.path.isdir(os.path.join(root, name)):
            continue  # files, and logstore's own hidden directories (.topics, .<id>-delete, ...)
        parsed = parse_partition_dir(name)
        if isinstance(parsed, str):
            skipped.append(SkippedDir(name, parsed))
        else:
            found.setdefault(parsed[0], []).append(parsed[1])
    topics = {}
    foreign: tuple[str, ...] = ()
    for topic, numbers in sorted(found.items()):
        numbers.sort()
        overrides: dict[str, str] = {}
        if topic == _OFFSETS_TOPIC:
            problem = offsets_topic_problem(root, tuple(numbers))
            if problem is not None:
                foreign = tuple(f"{topic}-{n}" for n in numbers)
                skipped.extend(SkippedDir(name, f"Kafka's consumer offsets in a layout logstore's consumer groups "
                                                f"cannot share: {problem}") for name in foreign)
                if not quiet:
                    logger.warning("%s: not adopting %s (%d partition director%s): %s", root, topic, len(numbers),
                                   "y" if len(numbers) == 1 else "ies", problem)
                continue
            overrides = dict(OFFSETS_TOPIC_OVERRIDES)
        adopted = AdoptedTopic(topic, numbers[-1] + 1, tuple(numbers), overrides, _topic_id(root, topic, numbers))
        if adopted.missing and not quiet:
            logger.warning("%s: topic %s has no directory for partition(s) %s (held by another broker?); "
                           "they are adopted empty", root, topic, _ranges(adopted.missing))
        topics[topic] = adopted
    if not quiet:
        for s in skipped:
            if not s.name.startswith(_OFFSETS_TOPIC + "-"):
                logger.info("%s: skipping %s: %s", root, s.name, s.reason)
    return LogDirScan(topics, tuple(skipped), foreign)


def _topic_id(root: str, topic: str, numbers: list[int]) -> uuid.UUID | None:
    """The topic id the partitions of ``topic`` in ``root`` keep in their ``partition.metadata``
    (KIP-516), None when none has the file.

    Raises:
        InconsistentTopicIdError: two partitions name different ids (Kafka would not load them).
        LogstoreError: a malformed ``partition.metadata``.
    """
    found: uuid.UUID | None = None
    first = -1
    for n in numbers:
        topic_id = read_partition_metadata(os.path.join(root, f"{topic}-{n}"))
        if topic_id is None:
            continue
        if found is None:
            found, first = topic_id, n
        elif topic_id != found:
            raise InconsistentTopicIdError(
                f"{root}: partitions {first} and {n} of topic {topic!r} name different topic ids in their "
                f"partition.metadata ({topic_id_text(found)}, {topic_id_text(topic_id)})")
    return found


def offsets_topic_problem(root: str, present: tuple[int, ...]) -> str | None:
    """Why the ``__consumer_offsets`` partitions ``present`` of ``root`` cannot serve as
    logstore's offsets topic, or None when they can (see the module docstring). Reads every
    valid batch of a one-partition topic (:class:`~logstore.log.segmentscan.BatchWalk`); a torn
    tail ends a segment's reading, as recovery would cut it, and a batch whole with a matching
    CRC that breaks the rules is a problem."""
    from ..groups.offsets import decode_offset_key, decode_offset_value
    from ..log.segmentscan import BatchWalk
    from ..records.batch import RecordDecoder
    from ..log.filenames import LOG_SUFFIX, parse_segment_name, segment_name

    if present != (0,):
        return (f"it has partition(s) {_ranges(present)}, while logstore's consumer groups keep every group in "
                "partition 0 (Kafka places a group in partition hash(group) % partition count)")
    directory = os.path.join(root, f"{_OFFSETS_TOPIC}-0")
    bases = sorted(p[0] for n in _fileio.ops.listdir(directory)
                   if (p := parse_segment_name(n)) is not None and p[1] == LOG_SUFFIX)
    decoder = RecordDecoder()
    for base in bases:
        path = os.path.join(directory, segment_name(base) + LOG_SUFFIX)
        data = _fileio.ops.map_file(path)
        try:
            walk = BatchWalk(data, base)
            for position, header in walk:
                try:
                    records, _ = decoder.decode(data, position, position + header.size, path=path)
                except CorruptRecordError as exc:
                    return f"{path} at position {position}: {exc.reason}"
                for r in records:
                    try:
                        if r.key is None or decode_offset_key(r.key) is None or r.value is None:
                            continue
                        decode_offset_value(r.value)
                    except CorruptRecordError as exc:
                        return f"{path}, offset {r.offset}: {exc.reason}"
            stop = walk.stop
            if stop.crc_valid:  # a batch written whole that breaks the rules: no torn tail
                return f"{path} at position {stop.position}: {stop.reason}"
        finally:
            if isinstance(data, mmap.mmap):
                data.close()
    return None


def _ranges(numbers: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5)`` as ``"0-2, 5"``."""
    out: list[str] = []
    start = prev = None
    for n in list(numbers) + [None]:  # type: ignore[list-item]
        if n is not None and prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    return ", ".join(out)


def adopt(root: str, topics_dir_name: str, lock: Callable[[], ContextManager[Any]],
          topic_file_text: Callable[[int, uuid.UUID, Mapping[str, str]], bytes],
          new_topic_id: Callable[[str], uuid.UUID]) -> tuple[str, ...]:
    """Create a store's topics directory ``root/<topics_dir_name>``, adopting the partition
    directories of a Kafka log directory found in ``root`` as topics (each topic file written by
    ``topic_file_text(partitions, topic_id, overrides)``, under ``lock()``, the store's metadata
    lock); return the names of the topics adopted. A topic keeps the id of its partitions'
    ``partition.metadata``; one without gets ``new_topic_id(name)``. Raises LogLockedError
    when a Kafka broker runs on the directory.

    Crash reasoning: the topic files are written into ``.topics.adopt/`` and that directory
    is renamed to ``.topics`` last, so a crash leaves no ``.topics/`` (the next open adopts
    again, from scratch) or a complete one. An incompatible ``__consumer_offsets`` is moved
    into :data:`~logstore.OFFSETS_ASIDE_DIR` before the rename; once that
    directory has entries, ``__consumer_offsets-<n>`` directories still in the root are the
    rest of the same topic (a crash interrupted the moving) and follow them.
    """
    ops = _fileio.ops
    topics_dir = os.path.join(root, topics_dir_name)
    if ops.exists(topics_dir):
        return ()
    with lock():
        if ops.exists(topics_dir):  # another process adopted meanwhile
            return ()
        found = scan(root)
        topics = dict(found.topics)
        foreign = list(found.foreign_offsets)
        aside = os.path.join(root, OFFSETS_ASIDE_DIR)
        if _OFFSETS_TOPIC in topics and ops.exists(aside) and ops.listdir(aside):
            foreign = [f"{_OFFSETS_TOPIC}-{p}" for p in topics.pop(_OFFSETS_TOPIC).present]
        if not topics and not foreign:
            ops.makedirs_durable(topics_dir)
            return ()
        refuse_kafka_broker(root)
        staging = topics_dir + ".adopt"
        ops.remove_tree(staging)
        ops.makedirs_durable(staging)
        for topic in topics.values():
            ops.write_file_atomic(os.path.join(staging, topic.name),
                                  topic_file_text(topic.partitions, topic.topic_id or new_topic_id(topic.name),
                                                  topic.overrides),
                                  tmp=os.path.join(root, topics_dir_name + ".tmp"))
        if foreign:
            ops.makedirs_durable(aside)
            for name in foreign:
                target = os.path.join(aside, name)
                if ops.exists(target):
                    target += f".{uuid.uuid4().hex}"
                ops.rename(os.path.join(root, name), target)
            ops.fsync_dir(aside)
            ops.fsync_dir(root)
            logger.warning("%s: moved Kafka's %s (%d partition director%s) into %s/: logstore's consumer "
                           "groups cannot share it", root, _OFFSETS_TOPIC, len(foreign),
                           "y" if len(foreign) == 1 else "ies", OFFSETS_ASIDE_DIR)
        ops.rename(staging, topics_dir)
        ops.fsync_dir(root)
    logger.warning("%s: adopted the partition directories of a Kafka log directory as %d topic(s) (%s) and "
                   "wrote %s/; Kafka does not load a log directory holding it", root, len(topics),
                   ", ".join(sorted(topics)), topics_dir_name)
    return tuple(sorted(topics))


def refuse_kafka_broker(root: str) -> None:
    """Raise LogLockedError when a running Kafka broker holds its log directory lock.

    A Kafka broker locks ``<log dir>/.lock`` with a Java FileLock, a POSIX record lock, which
    Linux keeps apart from the ``flock`` logstore takes on the same file; probing with a
    POSIX lock (taken and released at once) is what sees it.
    """
    path = os.path.join(root, BROKER_LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise LogLockedError(f"{root} is in use by a Kafka broker (it holds a lock on {path}); stop the broker, "
                                 "or open a copy of the directory") from None
        fcntl.lockf(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
