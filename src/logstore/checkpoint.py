"""Kafka's checkpoint text files.

A checkpoint file is, in Kafka's format::

    0                 <- version
    2                 <- number of entries
    orders 0 1500     <- one entry per line, fields separated by single spaces
    orders 1 1320

:class:`CheckpointFile` owns one such file (``recovery-point-offset-checkpoint``,
``log-start-offset-checkpoint``, ``cleaner-offset-checkpoint``,
``replication-offset-checkpoint`` in a log directory; ``leader-epoch-checkpoint`` in a partition
directory). Writes go to a temp file that is fsynced and renamed over the old one, then the
directory is fsynced, so a crash leaves the old or the new content, never a mix.

:class:`OffsetCheckpoints` is the read-merge-write view of a per-log-directory offset file shared by
several partitions, possibly held by several processes: each update takes an in-process lock and
an advisory file lock on ``<logdir>/.lock-<name>``.
"""

from __future__ import annotations

import os
import threading
from typing import Iterable, Sequence

from . import _fileio
from .errors import LogstoreError

__all__ = [
    "CheckpointFile",
    "OffsetCheckpoints",
    "RECOVERY_POINT_CHECKPOINT",
    "LOG_START_OFFSET_CHECKPOINT",
    "CLEANER_OFFSET_CHECKPOINT",
    "REPLICATION_OFFSET_CHECKPOINT",
    "LEADER_EPOCH_CHECKPOINT",
    "encode_checkpoint",
]

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"

CHECKPOINT_VERSION = 0


class CorruptCheckpointError(LogstoreError):
    """A checkpoint file does not follow Kafka's format."""


class CheckpointFile:
    """One Kafka checkpoint file of entries with ``fields`` whitespace-separated fields each.

    Durability: :meth:`write` returns after the new content and its directory entry are fsynced.
    Thread-safety: not thread-safe; callers serialise writes to one file.
    """

    def __init__(self, path: str, fields: int) -> None:
        self.path = path
        self.fields = fields

    def read(self) -> list[list[str]]:
        """Return the entries, or an empty list when the file does not exist.

        Raises:
            CorruptCheckpointError: wrong version, count mismatch or a malformed line.
        """
        if not _fileio.ops.exists(self.path):
            return []
        text = _fileio.ops.read_file(self.path).decode("utf-8", errors="replace")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if len(lines) < 2:
            raise CorruptCheckpointError(f"{self.path}: expected version and count lines")
        try:
            version = int(lines[0])
            count = int(lines[1])
        except ValueError:
            raise CorruptCheckpointError(f"{self.path}: malformed version/count lines") from None
        if version != CHECKPOINT_VERSION:
            raise CorruptCheckpointError(
                f"{self.path}: unsupported checkpoint version {version} (expected {CHECKPOINT_VERSION})"
            )
        entries = [line.split(" ") for line in lines[2:]]
        if len(entries) != count:
            raise CorruptCheckpointError(
                f"{self.path}: header says {count} entries but the file holds {len(entries)}"
            )
        for entry in entries:
            if len(entry) != self.fields:
                raise CorruptCheckpointError(
                    f"{self.path}: expected {self.fields} fields per line, got {' '.join(entry)!r}"
                )
        return entries

    def write(self, entries: Iterable[Sequence[object]]) -> None:
        """Replace the file's entries durably (temp file + fsync + rename + directory fsync)."""
        _fileio.ops.write_file_atomic(self.path, encode_checkpoint(entries, self.fields, self.path))


def encode_checkpoint(entries: Iterable[Sequence[object]], fields: int, what: str = "checkpoint") -> bytes:
    """A checkpoint file's bytes (version 0, the count, one line per entry of ``fields``
    whitespace-free fields), as :class:`CheckpointFile` writes them (and a remote segment's
    leader-epoch checkpoint is uploaded). Pure."""
    rows = []
    for entry in entries:
        values = [str(field) for field in entry]
        if len(values) != fields or any(not f or any(c.isspace() for c in f) for f in values):
            raise ValueError(f"{what}: an entry needs {fields} non-empty fields without whitespace, got {entry!r}")
        rows.append(" ".join(values))
    return (f"{CHECKPOINT_VERSION}\n{len(rows)}\n" + "".join(row + "\n" for row in rows)).encode("utf-8")


_process_locks: dict[str, threading.Lock] = {}
_process_locks_guard = threading.Lock()


def _process_lock(path: str) -> threading.Lock:
    with _process_locks_guard:
        lock = _process_locks.get(path)
        if lock is None:
            lock = _process_locks[path] = threading.Lock()
        return lock


class OffsetCheckpoints:
    """``topic partition offset`` entries of one log directory file, updated by read-merge-write.

    Durability: :meth:`update` returns once the merged file is durable.
    Thread- and process-safe: updates hold a per-file thread lock and an advisory ``flock``.
    """

    def __init__(self, log_dir: str, name: str) -> None:
        self.log_dir = log_dir
        self.file = CheckpointFile(os.path.join(log_dir, name), 3)
        self._lock_path = os.path.join(log_dir, f".lock-{name}")

    def read(self) -> dict[tuple[str, int], int]:
        """Return ``{(topic, partition): offset}``; a missing file reads as empty."""
        out: dict[tuple[str, int], int] = {}
        for topic, partition, offset in self.file.read():
            try:
                out[(topic, int(partition))] = int(offset)
            except ValueError:
                raise CorruptCheckpointError(
                    f"{self.file.path}: malformed entry {topic} {partition} {offset}"
                ) from None
        return out

    def get(self, key: tuple[str, int]) -> int | None:
        """Return the offset recorded for ``key`` or None."""
        return self.read().get(key)

    def update(self, changes: dict[tuple[str, int], int | None]) -> None:
        """Set (or, with None, remove) entries and write the file durably."""
        with _process_lock(self.file.path):
            with _fileio.ops.locked(self._lock_path):
                try:
                    current = self.read()
                except CorruptCheckpointError:
                    # A damaged checkpoint only costs a longer recovery; rewrite it whole.
                    current = {}
                for key, value in changes.items():
                    if value is None:
                        current.pop(key, None)
                    else:
                        current[key] = value
                self.file.write(
                    [(topic, partition, offset) for (topic, partition), offset in sorted(current.items())]
                )
