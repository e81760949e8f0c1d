"""A store's ACLs on disk: :class:`AclFile` owns ``<root>/.acls`` and ``<root>/.lock-acls``.

``.acls`` is JSON: ``{"version": 1, "acls": [binding, ...]}``, each binding an object of
Kafka's names (``{"resource_type": "TOPIC", "name": "orders", "pattern_type": "LITERAL",
"principal": "User:alice", "host": "*", "operation": "READ", "permission": "ALLOW"}``), sorted.
No file is no ACLs. A change (CreateAcls, DeleteAcls, ``logstore acls add/remove``) rewrites it
whole, atomically and durably (temp file, fsync, rename, directory fsync, through
``_fileio``), under the flock of ``.lock-acls``, after re-reading the file: two processes that
change the ACLs at once both keep their changes.

A reader (the server's authorizer, per request) compares the file's identity (device, inode,
size, modification time) with what it read last and re-reads it when it moved, so a change
made by another process sharing the store counts from the next request. A file that became
unreadable or invalid keeps the ACLs read before (logged once per change), so a torn edit by
hand never opens the store.

Why a file and not records in an internal topic: a store's ACLs are a few hundred small
entries that change rarely and are read on every request; a file that is replaced whole is
crash-safe by construction, readable by ``logstore acls`` without loading the log layer, and
shared by every process on the store through the file system.

Thread-safety: thread-safe. Durability: :meth:`AclFile.update` returns once the new file is
durable.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any, Callable, TypeVar

from .. import _fileio
from .acls import AclBinding, AclError, AclOperation, AclPermissionType, AclSet, PatternType, ResourceType

__all__ = ["AclFile", "ACL_FILE", "ACL_LOCK", "FORMAT_VERSION"]

logger = logging.getLogger("logstore.kafka")

#: The file of a store's ACLs, under its root.
ACL_FILE = ".acls"
#: The flock file that serialises changes of the ACLs between processes.
ACL_LOCK = ".lock-acls"
#: The version of the file's format.
FORMAT_VERSION = 1

R = TypeVar("R")


class AclFile:
    """The ACLs of the store at ``root`` (see the module docstring): :meth:`current` and
    :meth:`update` are an :class:`~logstore.kafka.acls.AclSource`. Thread-safe.

    Raises (at construction):
        AclError: the file exists and is not valid.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        self.path = os.path.join(self.root, ACL_FILE)
        self._lock = threading.Lock()
        self._stamp = self._identity()
        self._acls = self._read()

    def _identity(self) -> tuple[Any, ...] | None:
        return _fileio.ops.path_stamp(self.path)

    def _read(self) -> AclSet:
        if not _fileio.ops.exists(self.path):
            return AclSet()
        raw = _fileio.ops.read_file(self.path)
        return decode(raw, self.path)

    def current(self) -> AclSet:
        """The ACLs now: re-read when the file changed since the last look (one ``stat``)."""
        try:
            stamp = self._identity()
        except OSError:
            return self._acls
        if stamp == self._stamp:
            return self._acls
        with self._lock:
            if stamp != self._stamp:
                try:
                    self._acls = self._read()
                    logger.info("re-read the ACLs in %s (%d bindings)", self.path, len(self._acls))
                except (AclError, OSError) as exc:
                    logger.error("keeping the ACLs read before: %s", exc)
                self._stamp = stamp
            return self._acls

    def update(self, change: Callable[[AclSet], tuple[AclSet, R]]) -> R:
        """Re-read the file under the flock, apply ``change`` (the newest ACLs -> the new ACLs
        and a result), write the new ones (when they differ) durably, and return the result.

        Raises:
            AclError: the file on disk is invalid (nothing is written).
            OSError: the file could not be written (the ACLs stay as they were).
        """
        ops = _fileio.ops
        with self._lock:
            with ops.locked(os.path.join(self.root, ACL_LOCK)):
                acls = self._read()
                new, result = change(acls)
                if new != acls:
                    ops.write_file_atomic(self.path, encode(new))
                self._acls = new
                self._stamp = self._identity()
            return result


def encode(acls: AclSet) -> bytes:
    """The file's bytes for ``acls``."""
    entries = [{"resource_type": a.resource_type.name, "name": a.name, "pattern_type": a.pattern_type.name,
                "principal": a.principal, "host": a.host, "operation": a.operation.name,
                "permission": a.permission.name} for a in acls]
    lines = ",\n ".join(json.dumps(e, ensure_ascii=False) for e in entries)  # one binding a line
    return (f'{{"version": {FORMAT_VERSION}, "acls": [\n {lines}\n]}}\n' if entries else
            f'{{"version": {FORMAT_VERSION}, "acls": []}}\n').encode()


def decode(raw: bytes, source: str) -> AclSet:
    """The ACLs of a file's bytes.

    Raises:
        AclError: not the format, naming ``source`` and the entry.
    """
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise AclError(f"{source}: not an ACL file: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION or not isinstance(doc.get("acls"), list):
        raise AclError(f"{source}: not an ACL file of version {FORMAT_VERSION}")
    bindings = []
    for number, entry in enumerate(doc["acls"]):
        try:
            bindings.append(AclBinding(ResourceType[entry["resource_type"]], entry["name"],
                                       PatternType[entry["pattern_type"]], entry["principal"], entry["host"],
                                       AclOperation[entry["operation"]],
                                       AclPermissionType[entry["permission"]]).validate())
        except (KeyError, TypeError) as exc:
            raise AclError(f"{source}: entry {number}: missing or unknown {exc}") from None
        except AclError as exc:
            raise AclError(f"{source}: entry {number}: {exc}") from None
    return AclSet(bindings)
