"""A power-loss simulator for logstore: a FileOps that knows what an fsync has made durable.

Install it with ``with _fileio.install(PowerLossFileOps(root)) as ops:``, drive a Log, cut the
power (:meth:`PowerLossFileOps.schedule` makes the n-th sync from now raise :class:`PowerLoss`,
or just stop calling the Log), abandon the Log (``log._abandon()``: maps and descriptors go away,
nothing is flushed) and call :meth:`PowerLossFileOps.crash`, which rewrites the directory tree
under ``root`` to what a machine would find after rebooting. Then reopen the log with the plain
FileOps and check it. SQLite's ``src/test6.c`` and LevelDB's fault-injection Env work the same
way.

The model (everything under ``root``; paths outside it pass through untracked):

* A file is an inode, tracked by an id that never gets reused (the simulator follows renames;
  descriptors map to ids). Its *durable content* is a snapshot of the whole file, taken at each
  ``fsync``/``fdatasync`` of a descriptor open on it by reading the file back with ``os.pread``.
  Reading, not intercepting writes, is what makes mapped writes visible: the active segment and
  its indexes are written through ``mmap`` and reach the page cache without any write call.
  ``ftruncate``/``fallocate`` size changes and ``pwrite``s are durable at the next fsync of the
  file, like data. A file that was never fsynced has empty durable content.
* Directory entries (create, rename, unlink, mkdir, rmdir) are durable only once the parent
  directory is fsynced (``fsync_dir``): the durable namespace of a directory is the listing it
  had at its last ``fsync_dir``. An fsync of a file does not make its name durable (POSIX does
  not promise it). A lost create makes the file disappear; a lost rename puts the file back
  under its old name; a lost unlink brings the file back with its durable content. Directories
  created inside ``root`` follow the same rule in their parent; ``root`` itself is durable.
  Directories are inodes too (negative ids): a renamed directory takes its subtree along, and a
  lost rename of a directory puts the whole subtree back under its old name.
* Everything present when the simulator is created, or after :meth:`crash`, is durable.
* ``crash(mode="durable")`` (the default) keeps exactly the durable state: every byte written
  since the file's last fsync is lost and every namespace change since its directory's last
  fsync is undone.
* ``crash(mode="torn")`` is the pessimistic-but-possible machine of test6.c: a random subset of
  the non-durable work reached the disk. Per directory, a random *prefix* of the namespace
  operations since its last fsync persisted (journalled file systems commit metadata in order).
  Per file, the length is either the durable one or the current one, and each 512-byte sector
  where the current content differs from the durable one is kept old, taken new, or garbled
  (random bytes). Garbling touches only the bytes that changed since the last sync: bytes a
  program did not overwrite are never damaged (SQLite's "powersafe overwrite"). A file whose
  name persisted but that was unlinked since gets its durable content.

Sync points: every ``fsync``, ``fdatasync`` and ``fsync_dir`` on a tracked path is numbered
(:attr:`sync_count`; :attr:`events` lists ``(n, kind, relative path)``). ``schedule(n)`` makes
the n-th sync from now fail *before* taking effect: it raises :class:`PowerLoss` (a
BaseException, so that no ``except Exception`` in the library swallows it) and every later sync
raises it again without effect, as if the machine were already off. Non-sync operations keep
going to the real files; :meth:`crash` undoes whatever is not durable.

``real_sync=False`` (default) skips the real fsync system calls: durability is simulated, and the
tests run at page-cache speed.

Thread-safety: all state is guarded by one lock, so a Log used from several threads can run on it.
"""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import stat
import threading
from typing import Iterator

from logstore._fileio import FileOps

__all__ = ["PowerLoss", "PowerLossFileOps", "is_dir", "ROOT"]

#: Inode ids: files are numbered 1, 2, ...; directories -1 (the root), -2, ...
ROOT = -1
SECTOR = 512
_EMPTY: tuple[bytes, int] = (b"", 0)


def is_dir(entry: object) -> bool:
    """Whether a namespace entry (an inode id) names a directory."""
    return isinstance(entry, int) and entry < 0


class PowerLoss(BaseException):
    """The simulated machine lost power at a scheduled sync point."""


def _pack(data: bytes) -> tuple[bytes, int]:
    """Content as (bytes without the zero tail, length): preallocated files are mostly zeros."""
    return data.rstrip(b"\0"), len(data)


def _unpack(packed: tuple[bytes, int]) -> bytes:
    data, size = packed
    return data + bytes(size - len(data))


def _read_fd(fd: int) -> bytes:
    """The whole content of the file open on ``fd`` (the page cache, mapped writes included)."""
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
        # Write-only descriptor (write_file_atomic's temp file): read through a new one.
        return _read_path(f"/proc/self/fd/{fd}")
    size = os.fstat(fd).st_size
    chunks = []
    position = 0
    while position < size:
        chunk = os.pread(fd, min(size - position, 1 << 22), position)
        if not chunk:
            break
        chunks.append(chunk)
        position += len(chunk)
    return b"".join(chunks)


def _read_path(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _read_fd(fd)
    finally:
        os.close(fd)


def torn_content(durable: bytes, current: bytes, rng: random.Random) -> bytes:
    """A possible on-disk content after power loss, given the content at the last fsync and
    the content in the page cache (see the module docstring, mode "torn")."""
    if durable == current:
        return durable
    length = rng.choice((len(durable), len(current)))
    old = durable[:length].ljust(length, b"\0")
    new = current[:length].ljust(length, b"\0")
    out = bytearray(old)
    for start in range(0, length, SECTOR):
        stop = min(length, start + SECTOR)
        o, n = old[start:stop], new[start:stop]
        if o == n:
            continue
        choice = rng.randrange(3)
        if choice == 1:
            out[start:stop] = n
        elif choice == 2:
            noise = rng.randbytes(stop - start)
            out[start:stop] = bytes(noise[i] if o[i] != n[i] else o[i] for i in range(stop - start))
    return bytes(out)


class PowerLossFileOps(FileOps):
    """FileOps that records what is durable under ``root`` and can reboot the tree to it.

    Args:
        root: directory whose subtree is tracked (created if missing; durable).
        real_sync: also issue the real fsync system calls (slow; not needed for the model).
    """

    def __init__(self, root: str | os.PathLike[str], real_sync: bool = False) -> None:
        self.root = os.path.realpath(os.fspath(root))
        os.makedirs(self.root, exist_ok=True)
        self.real_sync = real_sync
        self._mutex = threading.RLock()
        self._next_id = 0
        self._next_dir = ROOT
        self.sync_count = 0
        self.events: list[tuple[int, str, str]] = []
        self.crashes = 0
        self.leaked_fds = 0
        self._reset_from_disk()

    # ------------------------------------------------------------------ state
    def _reset_from_disk(self) -> None:
        """Take the tree as it is now as the durable state (start, or after a crash)."""
        #: directory id -> {name: inode id}, as the page cache sees it
        self._cur: dict[int, dict[str, int]] = {}
        #: directory id -> {name: inode id} as of its last fsync_dir
        self._durable_ns: dict[int, dict[str, int]] = {}
        #: directory id -> namespace operations since its last fsync_dir, in order
        self._oplog: dict[int, list[tuple]] = {}
        #: path of every directory in the page cache -> its id
        self._dirs: dict[str, int] = {}
        #: file id -> content at its last fsync (packed)
        self._durable_data: dict[int, tuple[bytes, int]] = {}
        self._fds: dict[int, int] = {}
        #: file id -> its current path (absent once unlinked)
        self._where: dict[int, str] = {}
        self.dead = False
        self._crash_at: int | None = None
        self._next_dir = ROOT
        self._dirs[self.root] = self._new_dir()
        for dirpath, dirnames, filenames in os.walk(self.root):
            entries: dict[str, int] = {}
            for name in dirnames:
                entries[name] = self._dirs[os.path.join(dirpath, name)] = self._new_dir()
            for name in filenames:
                path = os.path.join(dirpath, name)
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    continue
                fid = self._new_id()
                entries[name] = fid
                self._where[fid] = path
                self._durable_data[fid] = _pack(_read_path(path))
            did = self._dirs[dirpath]
            self._cur[did] = entries
            self._durable_ns[did] = dict(entries)
            self._oplog[did] = []

    def _new_dir(self) -> int:
        did = self._next_dir
        self._next_dir -= 1
        return did

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _norm(self, path: str | os.PathLike[str]) -> str:
        path = os.path.abspath(os.fspath(path))
        head, tail = os.path.split(path)
        return os.path.join(os.path.realpath(head), tail) if tail else os.path.realpath(head)

    def _tracked(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + os.sep)

    def _rel(self, path: str) -> str:
        return os.path.relpath(path, self.root)

    def _entry(self, path: str) -> int | None:
        head, tail = os.path.split(path)
        did = self._dirs.get(head)
        return None if did is None else self._cur.get(did, {}).get(tail)

    def _log_op(self, directory: str, op: tuple) -> None:
        self._oplog.setdefault(self._dirs[directory], []).append(op)

    def _path_of(self, fid: int) -> str | None:
        return self._where.get(fid)

    # ------------------------------------------------------------------ power cuts
    def schedule(self, n: int) -> None:
        """Lose power at the n-th sync from now (n >= 1), before it takes effect."""
        if n < 1:
            raise ValueError("n must be >= 1")
        with self._mutex:
            self._crash_at = self.sync_count + n

    def cut(self) -> None:
        """Lose power now: no later sync takes effect."""
        with self._mutex:
            self.dead = True

    def _sync_point(self, kind: str, path: str) -> None:
        """Count a sync; raise PowerLoss if the power is (or now goes) off."""
        self.sync_count += 1
        self.events.append((self.sync_count, kind, self._rel(path)))
        if self._crash_at is not None and self.sync_count >= self._crash_at:
            self.dead = True
        if self.dead:
            raise PowerLoss(f"power lost at sync {self.sync_count} ({kind} {self._rel(path)})")

    # ------------------------------------------------------------------ descriptors
    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        p = self._norm(path)
        if not self._tracked(p):
            return super().open(path, flags, mode)
        with self._mutex:
            fid = self._entry(p)
            if fid is None and os.path.lexists(p):
                raise AssertionError(f"{p} was created behind the simulator's back (not through ops)")
            fd = super().open(path, flags, mode)
            if fid is None:
                fid = self._new_id()
                head, tail = os.path.split(p)
                self._cur[self._dirs[head]][tail] = fid
                self._where[fid] = p
                self._log_op(head, ("create", tail, fid))
            elif is_dir(fid):
                raise AssertionError(f"logstore opened directory {p} through ops.open")
            self._fds[fd] = fid  # type: ignore[assignment]
            return fd

    def close(self, fd: int) -> None:
        with self._mutex:
            self._fds.pop(fd, None)
        super().close(fd)

    def _snapshot(self, fd: int, kind: str) -> None:
        with self._mutex:
            fid = self._fds.get(fd)
            if fid is None:  # not a tracked file: the real thing
                getattr(super(), kind)(fd)
                return
            self._sync_point(kind, self._path_of(fid) or f"<unlinked #{fid}>")
            if self.real_sync:
                os.fsync(fd)
            self._durable_data[fid] = _pack(_read_fd(fd))

    def fsync(self, fd: int) -> None:
        self._snapshot(fd, "fsync")

    def fdatasync(self, fd: int) -> None:
        self._snapshot(fd, "fdatasync")

    # ftruncate, fallocate, pwrite, mmap, pread, fsize, lock: the real call; their effect on
    # the content is captured (or lost) at the next fsync of the file.

    # ------------------------------------------------------------------ namespace
    def makedirs(self, path: str) -> None:
        p = self._norm(path)
        if not self._tracked(p):
            return super().makedirs(path)
        with self._mutex:
            missing = []
            q = p
            while self._tracked(q) and not os.path.isdir(q):
                missing.append(q)
                q = os.path.dirname(q)
            super().makedirs(path)
            for d in reversed(missing):
                head, tail = os.path.split(d)
                did = self._dirs[d] = self._new_dir()
                self._cur[self._dirs[head]][tail] = did
                self._log_op(head, ("mkdir", tail, did))
                self._cur[did] = {}
                self._durable_ns[did] = {}
                self._oplog[did] = []

    def rename(self, src: str, dst: str) -> None:
        s, d = self._norm(src), self._norm(dst)
        if not (self._tracked(s) or self._tracked(d)):
            return super().rename(src, dst)
        with self._mutex:
            inode = self._entry(s)
            if inode is None:
                raise AssertionError(f"rename of untracked {s}")
            super().rename(src, dst)
            shead, stail = os.path.split(s)
            dhead, dtail = os.path.split(d)
            del self._cur[self._dirs[shead]][stail]
            replaced = self._cur[self._dirs[dhead]].get(dtail)
            if replaced is not None and not is_dir(replaced):
                self._where.pop(replaced, None)
            self._cur[self._dirs[dhead]][dtail] = inode
            if is_dir(inode):
                # Everything below moves with it: re-key the paths (ids stay).
                prefix = s + os.sep
                for path in [p for p in self._dirs if p == s or p.startswith(prefix)]:
                    self._dirs[d + path[len(s):]] = self._dirs.pop(path)
                for fid, path in list(self._where.items()):
                    if path.startswith(prefix):
                        self._where[fid] = d + path[len(s):]
            else:
                self._where[inode] = d
            if shead == dhead:
                self._log_op(shead, ("rename", stail, dtail, inode))
            else:
                self._log_op(shead, ("unlink", stail))
                self._log_op(dhead, ("create", dtail, inode))

    def unlink(self, path: str) -> None:
        p = self._norm(path)
        if not self._tracked(p):
            return super().unlink(path)
        with self._mutex:
            super().unlink(path)
            head, tail = os.path.split(p)
            fid = self._cur[self._dirs[head]].pop(tail, None)
            if fid is not None:
                self._where.pop(fid, None)
            self._log_op(head, ("unlink", tail))

    def rmdir(self, path: str) -> None:
        p = self._norm(path)
        if not self._tracked(p):
            return super().rmdir(path)
        with self._mutex:
            super().rmdir(path)
            head, tail = os.path.split(p)
            self._cur[self._dirs[head]].pop(tail, None)
            self._dirs.pop(p, None)
            self._log_op(head, ("rmdir", tail))

    def fsync_dir(self, path: str) -> None:
        p = self._norm(path)
        if not self._tracked(p):
            return super().fsync_dir(path)
        with self._mutex:
            self._sync_point("fsync_dir", p)
            if self.real_sync:
                super().fsync_dir(path)
            did = self._dirs[p]
            self._durable_ns[did] = dict(self._cur[did])
            self._oplog[did] = []

    def resync(self) -> None:
        """Take the tree as it is now as durable (after another FileOps changed it, e.g. a
        verification pass with the plain ops). Open descriptors are forgotten."""
        with self._mutex:
            self._reset_from_disk()

    # ------------------------------------------------------------------ inspection
    def _durable_lookup(self, path: str) -> int | None:
        """The inode ``path`` names in the durable namespace (None if it would be gone)."""
        rel = os.path.relpath(path, self.root)
        inode: int | None = ROOT
        for part in ([] if rel == "." else rel.split(os.sep)):
            if inode is None or not is_dir(inode):
                return None
            inode = self._durable_ns.get(inode, {}).get(part)
        return inode

    def durable_names(self, path: str) -> set[str]:
        """Names in directory ``path`` that would survive a power loss now (mode "durable")."""
        with self._mutex:
            did = self._durable_lookup(self._norm(path))
            return set(self._durable_ns.get(did, {})) if did is not None and is_dir(did) else set()

    def durable_content(self, path: str) -> bytes | None:
        """What ``path`` would hold after a power loss now (mode "durable"); None if gone."""
        with self._mutex:
            fid = self._durable_lookup(self._norm(path))
            if fid is None or is_dir(fid):
                return None
            return _unpack(self._durable_data.get(fid, _EMPTY))

    # ------------------------------------------------------------------ the crash
    def crash(self, mode: str = "durable", rng: random.Random | None = None) -> None:
        """Reboot: rewrite the tree under ``root`` to a state the disk could hold after power loss.

        Abandon every Log first (``log._abandon()``). Descriptors still open on tracked files
        (a library leak) are closed and counted in :attr:`leaked_fds`. Afterwards the tree is
        entirely durable and the simulator is powered on again (no sync scheduled).
        """
        if mode not in ("durable", "torn"):
            raise ValueError(f"mode must be 'durable' or 'torn', got {mode!r}")
        rng = rng or random.Random(self.crashes)
        with self._mutex:
            for fd in list(self._fds):
                self.leaked_fds += 1
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._fds.clear()
            plan = self._plan(ROOT, mode, rng)
            self._apply(self.root, plan)
            self.crashes += 1
            self._reset_from_disk()

    def _plan(self, did: int, mode: str, rng: random.Random) -> dict[str, object]:
        """{name: bytes | sub-plan dict} for directory ``did`` after the crash."""
        names = dict(self._durable_ns.get(did, {}))
        if mode == "torn":
            ops = self._oplog.get(did, [])
            for op in ops[: rng.randint(0, len(ops))]:
                if op[0] in ("create", "mkdir"):
                    names[op[1]] = op[2]
                elif op[0] in ("unlink", "rmdir"):
                    names.pop(op[1], None)
                elif op[0] == "rename":
                    names.pop(op[1], None)
                    names[op[2]] = op[3]
        plan: dict[str, object] = {}
        for name, value in names.items():
            if is_dir(value):
                plan[name] = self._plan(value, mode, rng)
                continue
            durable = _unpack(self._durable_data.get(value, _EMPTY))
            if mode == "torn":
                live = self._path_of(value)
                if live is not None and os.path.isfile(live):
                    durable = torn_content(durable, _read_path(live), rng)
            plan[name] = durable
        return plan

    def _apply(self, directory: str, plan: dict[str, object]) -> None:
        os.makedirs(directory, exist_ok=True)
        for entry in os.scandir(directory):
            want = plan.get(entry.name)
            a_dir = entry.is_dir(follow_symlinks=False)
            if a_dir and isinstance(want, dict):
                continue
            if a_dir:
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)  # a fresh inode: stale maps of the old one stay harmless
        for name, want in plan.items():
            path = os.path.join(directory, name)
            if isinstance(want, dict):
                self._apply(path, want)
                continue
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(want)  # type: ignore[arg-type]
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)

    def walk(self) -> Iterator[str]:
        """Paths of tracked files as the page cache sees them (debugging)."""
        with self._mutex:
            yield from list(self._where.values())
