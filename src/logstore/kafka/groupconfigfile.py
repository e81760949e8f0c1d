"""A store's group configs on disk: :class:`GroupConfigFile` owns ``<root>/.group-configs`` and
``<root>/.lock-group-configs``.

``.group-configs`` is JSON: ``{"version": 1, "groups": {"<group id>": {"<config>": "<value>"}}}``,
each group's own configs (Kafka's group configs, resource type GROUP: what IncrementalAlterConfigs
and AlterConfigs set, by Kafka's names, values as Kafka keeps them, as text), sorted. No file is
no group configs; a group whose last config is deleted leaves the file. A change rewrites the
file whole, atomically and durably (temp file, fsync, rename, directory fsync, through
``_fileio``), under the flock of ``.lock-group-configs``, after re-reading it: two processes that
change group configs at once both keep their changes. The file outlives the groups (DeleteGroups
leaves a group's configs, as Kafka does).

A reader (the consumer group coordinator at each heartbeat, DescribeConfigs) compares the file's
identity (device, inode, size, modification time) with what it read last and re-reads it when it
moved, so a change made by another process sharing the store counts from the next heartbeat. A
file that became unreadable or invalid keeps the configs read before (logged once per change).

Why a file, as the store's ``.topic-defaults`` and ``.acls``: a few small entries that change
rarely and are read often; a file replaced whole is crash-safe by construction and shared by
every process on the store through the file system.

Thread-safety: thread-safe. Durability: :meth:`GroupConfigFile.update` returns once the new file
is durable.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any, Callable, Mapping, TypeVar

from .. import _fileio
from ..errors import LogstoreError

__all__ = ["GroupConfigFile", "GroupConfigFileError", "GROUP_CONFIG_FILE", "GROUP_CONFIG_LOCK", "FORMAT_VERSION"]

logger = logging.getLogger("logstore.kafka")

#: The file of a store's group configs, under its root.
GROUP_CONFIG_FILE = ".group-configs"
#: The flock file that serialises changes of the group configs between processes.
GROUP_CONFIG_LOCK = ".lock-group-configs"
#: The version of the file's format.
FORMAT_VERSION = 1

R = TypeVar("R")
#: group id -> {config name: value}
Configs = Mapping[str, Mapping[str, str]]


class GroupConfigFileError(LogstoreError, ValueError):
    """A group config file that is not of the format (the message names the file and why)."""


class GroupConfigFile:
    """The group configs of the store at ``root`` (see the module docstring). A file that is
    not valid at construction is logged and read as no configs (every group on the broker's
    defaults) until it is replaced by a valid one; a change refuses to overwrite it
    (:meth:`update` raises). Thread-safe."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        self.path = os.path.join(self.root, GROUP_CONFIG_FILE)
        self._lock = threading.Lock()
        self._stamp = _fileio.ops.path_stamp(self.path)
        self._configs: dict[str, dict[str, str]] = {}
        try:
            self._configs = self._read()
        except (GroupConfigFileError, OSError) as exc:
            logger.error("every group on the broker's defaults until the group configs are readable: %s", exc)

    def _read(self) -> dict[str, dict[str, str]]:
        if not _fileio.ops.exists(self.path):
            return {}
        return decode(_fileio.ops.read_file(self.path), self.path)

    def current(self) -> Configs:
        """Every group's own configs now (do not change the answer): re-read when the file
        changed since the last look (one ``stat``)."""
        try:
            stamp = _fileio.ops.path_stamp(self.path)
        except OSError:
            return self._configs
        if stamp == self._stamp:
            return self._configs
        with self._lock:
            if stamp != self._stamp:
                try:
                    self._configs = self._read()
                except (GroupConfigFileError, OSError) as exc:
                    logger.error("keeping the group configs read before: %s", exc)
                self._stamp = stamp
            return self._configs

    def of(self, group: str) -> Mapping[str, str]:
        """One group's own configs (empty when it has none)."""
        return self.current().get(group, {})

    def update(self, group: str, change: Callable[[Mapping[str, str]], tuple[Mapping[str, str] | None, R]]) -> R:
        """Re-read the file under the flock, apply ``change`` (the group's newest configs -> its
        new configs, or None to keep them, and a result), write the file (when they differ)
        durably, and return the result.

        Raises:
            GroupConfigFileError: the file on disk is invalid (nothing is written).
            OSError: the file could not be written (the configs stay as they were).
        """
        ops = _fileio.ops
        with self._lock:
            with ops.locked(os.path.join(self.root, GROUP_CONFIG_LOCK)):
                configs = self._read()
                new, result = change(configs.get(group, {}))
                if new is not None and dict(new) != configs.get(group, {}):
                    configs = dict(configs)
                    if new:
                        configs[group] = dict(new)
                    else:
                        configs.pop(group, None)
                    ops.write_file_atomic(self.path, encode(configs))
                self._configs = configs
                self._stamp = ops.path_stamp(self.path)
            return result


def encode(configs: Configs) -> bytes:
    """The file's bytes for ``configs``."""
    doc = {"version": FORMAT_VERSION, "groups": {g: dict(sorted(c.items())) for g, c in sorted(configs.items())}}
    return (json.dumps(doc, ensure_ascii=False, indent=1) + "\n").encode()


def decode(raw: bytes, source: str) -> dict[str, dict[str, str]]:
    """The group configs of a file's bytes.

    Raises:
        GroupConfigFileError: not the format, naming ``source``.
    """
    try:
        doc: Any = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise GroupConfigFileError(f"{source}: not a group config file: {exc}") from None
    groups = doc.get("groups") if isinstance(doc, dict) and doc.get("version") == FORMAT_VERSION else None
    if not isinstance(groups, dict) or not all(
            isinstance(c, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in c.items())
            for c in groups.values()):
        raise GroupConfigFileError(f"{source}: not a group config file of version {FORMAT_VERSION}")
    return {g: dict(c) for g, c in groups.items()}
