"""A crash-state explorer in the manner of ALICE (Pillai et al., OSDI 2014), over powerloss.py.

A workload runs once, under :class:`Recorder` (a :class:`PowerLossFileOps`). At each of its sync
points, just before the sync takes effect, the recorder captures a :class:`CrashPoint`: the
durable namespace of every directory, the namespace operations since each directory's last
fsync, the durable content of every file and its content in the page cache, and the workload's
*oracle* (what it has been told is durable so far). A point can also be marked between syncs
(:meth:`Recorder.mark`, e.g. after the workload's last step).

For every crash point the explorer then enumerates the disk states a machine could reboot into,
builds each one in a scratch directory and hands it to the workload's check, which reopens the
store with the plain FileOps and compares it with the oracle. A state is a choice per *axis*:

* a directory with namespace operations since its last fsync: any prefix of them persisted
  (journalled file systems commit metadata in order), or all but one, or only one of them
  (operations reordered between sync points); operations whose source is missing in a choice
  (a rename of a file whose create was lost) make that choice impossible, and it is skipped;
* a file whose page-cache content differs from its durable content: old (nothing since its
  last fsync reached the disk), new (everything did), or torn at a 512-byte or 4-KiB boundary
  inside the changed region: new before the boundary and, after it, the old content with the
  new length (a zero-filled tail, the size reached the disk before the data), the file cut at
  the boundary (a partial append), or the sector at the boundary garbled (random bytes in the
  bytes that changed: a program's unchanged bytes are never damaged, SQLite's "powersafe
  overwrite"), or each changed piece new or old independently (writes reordered). Files change
  independently of each other and of the namespace, so a rename can persist while the data of
  the renamed file does not (the classic ALICE finding).

States per crash point: the durable state; the page-cache state (a process crash); every
variant of one axis with every other axis durable, and again with every other axis at its
page-cache state; every old/new combination of up to 5 axes (32 samples above that); and
``random_states`` random combinations. Where that makes more than ``max_states_per_point``,
the durable and page-cache states and a random sample of the others are taken. Identical disk
images of one crash point are checked once. The states of different crash points are checked in ``workers`` forked processes.

Thread-safety: none; one explorer per test.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import pickle
import random
import shutil
import struct
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from logstore import _fileio
from logstore._fileio import FileOps

from powerloss import ROOT, PowerLossFileOps, _EMPTY, _pack, _read_path, _unpack, is_dir

__all__ = ["CrashPoint", "Recorder", "Report", "REPORTS", "explore", "file_variants", "dir_variants", "GRANULES"]

#: Torn-write granularities: a disk sector and a page.
GRANULES = (512, 4096)
#: Tear boundaries per file and granularity beyond which they are sampled.
MAX_TEARS = 6


@dataclass
class CrashPoint:
    """Everything needed to rebuild any disk state possible after a power loss at one point."""

    index: int
    label: str
    oracle: Any
    #: directory id -> {name: inode id} as of its last fsync_dir (powerloss.py's ids)
    names: dict[int, dict[str, int]]
    #: directory id -> namespace operations since its last fsync_dir, in order
    oplog: dict[int, list[tuple]]
    #: directory id -> its path relative to the root (for reports)
    dir_paths: dict[int, str]
    #: file id -> packed durable content / packed page-cache content
    durable: dict[int, tuple[bytes, int]]
    current: dict[int, tuple[bytes, int]]


class Recorder(PowerLossFileOps):
    """Runs a workload once and captures a :class:`CrashPoint` before every sync.

    ``oracle()`` is called at each point; it must return a value the checks can rely on (it is
    deep-copied through pickle), describing what was acknowledged as durable so far.
    """

    def __init__(self, root: str | os.PathLike[str], oracle: Callable[[], Any]) -> None:
        self._oracle = oracle
        self.points: list[CrashPoint] = []
        super().__init__(root)

    def _sync_point(self, kind: str, path: str) -> None:
        self.points.append(self._capture(f"{kind} {self._rel(path)}"))
        super()._sync_point(kind, path)

    def mark(self, label: str) -> None:
        """Capture a crash point now (between syncs)."""
        with self._mutex:
            self.points.append(self._capture(label))

    def _capture(self, label: str) -> CrashPoint:
        fids: set[int] = set()
        for entries in self._durable_ns.values():
            fids.update(v for v in entries.values() if not is_dir(v))
        for ops in self._oplog.values():
            for op in ops:
                if op[0] == "create" and not is_dir(op[2]):
                    fids.add(op[2])
                elif op[0] == "rename" and not is_dir(op[3]):
                    fids.add(op[3])
        durable = {fid: self._durable_data.get(fid, _EMPTY) for fid in fids}
        current = {}
        for fid in fids:
            path = self._where.get(fid)
            current[fid] = _pack(_read_path(path)) if path is not None and os.path.isfile(path) else durable[fid]
        return CrashPoint(
            index=len(self.points), label=label, oracle=pickle.loads(pickle.dumps(self._oracle())),
            names={d: dict(e) for d, e in self._durable_ns.items()},
            oplog={d: list(o) for d, o in self._oplog.items() if o},
            dir_paths={did: os.path.relpath(path, self.root) for path, did in self._dirs.items()},
            durable=durable, current=current)


# ---------------------------------------------------------------------------- axes
def dir_variants(names: dict[str, int], ops: list[tuple]) -> list[tuple[str, dict[str, int]]]:
    """Namespaces a directory can hold after a crash: [durable, page cache, others...]."""

    def apply(seq: list[tuple]) -> dict[str, int] | None:
        ns = dict(names)
        for op in seq:
            kind = op[0]
            if kind in ("create", "mkdir"):
                ns[op[1]] = op[2]
            elif kind in ("unlink", "rmdir"):
                if op[1] not in ns:
                    return None
                del ns[op[1]]
            elif kind == "rename":
                if ns.get(op[1]) != op[3]:
                    return None
                del ns[op[1]]
                ns[op[2]] = op[3]
        return ns

    n = len(ops)
    candidates: list[tuple[str, list[tuple]]] = [("durable", []), ("all", ops)]
    candidates += [(f"first {k} of {n}", ops[:k]) for k in range(1, n)]
    if n >= 2:
        for i in range(n):
            candidates.append((f"all but {_op(ops[i])}", ops[:i] + ops[i + 1:]))
            candidates.append((f"only {_op(ops[i])}", [ops[i]]))
    out: list[tuple[str, dict[str, int]]] = []
    seen: set[tuple] = set()
    for label, seq in candidates:
        ns = apply(seq)
        if ns is None:
            continue
        key = tuple(sorted(ns.items(), key=lambda kv: kv[0]))
        if key not in seen:
            seen.add(key)
            out.append((label, ns))
    return out


def _op(op: tuple) -> str:
    return f"{op[0]} {op[1]}" + (f"->{op[2]}" if op[0] == "rename" else "")


def _changed(a: bytes, b: bytes, chunk: int = 4096) -> tuple[int, int]:
    """[lo, hi): the smallest range outside which two equally long contents agree."""
    width = len(a)
    lo = 0
    while lo < width and a[lo:lo + chunk] == b[lo:lo + chunk]:
        lo += chunk
    while lo < width and a[lo] == b[lo]:
        lo += 1
    hi = width
    while hi > lo and a[max(lo, hi - chunk):hi] == b[max(lo, hi - chunk):hi]:
        hi -= chunk
    hi = max(hi, lo)
    while hi > lo and a[hi - 1] == b[hi - 1]:
        hi -= 1
    return lo, hi


def file_variants(old: bytes, new: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    """Contents a file can hold after a crash: [old, new, tears...] (see the module docstring)."""
    if old == new:
        return [("same", old)]
    out = [("old", old), ("new", new)]
    n = len(new)
    width = max(len(old), n)
    a, b = old.ljust(width, b"\0"), new.ljust(width, b"\0")
    lo, hi = _changed(a, b)
    for g in GRANULES:
        bounds = list(range((lo // g + 1) * g, hi, g))
        if len(bounds) > MAX_TEARS:
            bounds = sorted({bounds[0], bounds[-1], *rng.sample(bounds, MAX_TEARS - 2)})
        for cut in bounds:
            if cut >= n:
                continue
            out.append((f"new up to {cut}, old after ({g} B pieces)", new[:cut] + a[cut:n]))
            if cut > len(old):
                out.append((f"append cut at {cut} ({g} B pieces)", new[:cut]))
            end = min(n, cut + g)
            noise = rng.randbytes(end - cut)
            sector = bytes(noise[i - cut] if a[i] != b[i] else a[i] for i in range(cut, end))
            out.append((f"new up to {cut}, garbage sector, old after ({g} B pieces)",
                        new[:cut] + sector + a[end:n]))
        pieces = list(range(lo // g * g, min(hi, n), g))
        if len(pieces) >= 2:
            # Writes reordered: each changed piece reached the disk or not, independently.
            mixed = bytearray(a[:n])
            for start in pieces:
                if rng.random() < 0.5:
                    mixed[start:start + g] = new[start:start + g]
            out.append((f"{g} B pieces reordered", bytes(mixed)))
    unique: list[tuple[str, bytes]] = []
    seen: set[bytes] = set()
    for label, data in out:
        if data not in seen:
            seen.add(data)
            unique.append((label, data))
    return unique


# ---------------------------------------------------------------------------- states of a point
@dataclass
class _Axis:
    kind: str  # "dir" | "file"
    key: Any   # directory path | file id
    name: str
    variants: list[tuple[str, Any]]


def _axes(point: CrashPoint, rng: random.Random) -> list[_Axis]:
    axes = []
    for did in sorted(point.oplog, reverse=True):
        variants = dir_variants(point.names.get(did, {}), point.oplog[did])
        if len(variants) > 1:
            rel = point.dir_paths.get(did, f"<removed dir {did}>")
            axes.append(_Axis("dir", did, "<root>/" if rel == "." else rel + "/", variants))
    for fid in sorted(point.current):
        old, new = _unpack(point.durable[fid]), _unpack(point.current[fid])
        if old != new:
            variants = [(label, _pack(data)) for label, data in file_variants(old, new, rng)]
            axes.append(_Axis("file", fid, f"#{fid}", variants))
    return axes


def _choices(axes: list[_Axis], rng: random.Random, random_states: int, cap: int) -> list[tuple[int, ...]]:
    """The states to try at one crash point, systematic ones first, at most ``cap``."""
    k = len(axes)
    zero = (0,) * k
    cache = tuple(1 if len(a.variants) > 1 else 0 for a in axes)
    out = [zero, cache]
    for i, axis in enumerate(axes):
        for v in range(len(axis.variants)):
            for base in (zero, cache):
                out.append(base[:i] + (v,) + base[i + 1:])
    if k <= 5:
        for bits in itertools.product((0, 1), repeat=k):
            out.append(tuple(b if len(a.variants) > 1 else 0 for a, b in zip(axes, bits)))
    else:
        for _ in range(32):
            out.append(tuple(rng.randrange(2) if len(a.variants) > 1 else 0 for a in axes))
    for _ in range(random_states):
        out.append(tuple(rng.randrange(len(a.variants)) for a in axes))
    unique = list(dict.fromkeys(out))
    if len(unique) > cap:
        unique = unique[:2] + rng.sample(unique[2:], cap - 2)
    return unique


def _image(point: CrashPoint, axes: list[_Axis], choice: tuple[int, ...]) -> dict[str, tuple[bytes, int] | None]:
    """{relative path: packed content, or None for a directory} of one state."""
    ns_choice = {a.key: a.variants[v][1] for a, v in zip(axes, choice) if a.kind == "dir"}
    data_choice = {a.key: a.variants[v][1] for a, v in zip(axes, choice) if a.kind == "file"}
    image: dict[str, tuple[bytes, int] | None] = {}

    def walk(did: int, prefix: str) -> None:
        names = ns_choice.get(did, point.names.get(did, {}))
        for name, value in names.items():
            rel = prefix + name
            if is_dir(value):
                image[rel] = None
                walk(value, rel + "/")
            elif value in data_choice:
                image[rel] = data_choice[value]
            else:
                image[rel] = point.durable.get(value, _EMPTY)

    walk(ROOT, "")
    return image


def _digest(image: dict[str, tuple[bytes, int] | None]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for rel in sorted(image):
        packed = image[rel]
        h.update(rel.encode() + b"\0")
        h.update(b"D" if packed is None else struct.pack("<QQ", packed[1], len(packed[0])) + packed[0])
    return h.digest()


def _materialise(image: dict[str, tuple[bytes, int] | None], target: str) -> None:
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    for rel in sorted(image):
        packed = image[rel]
        path = os.path.join(target, rel)
        if packed is None:
            os.makedirs(path, exist_ok=True)
            continue
        data, size = packed
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if size > len(data):
                os.ftruncate(fd, size)  # the zero tail, sparse
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------- the driver
@dataclass
class Report:
    """What an exploration did: crash points, distinct states checked, violations found."""

    points: int = 0
    states: int = 0
    violations: list[str] = field(default_factory=list)
    #: kinds of crash point explored: "fsync *.log", "fsync_dir orders-0", "fsync x.tmp", ...
    kinds: set[str] = field(default_factory=set)

    def merge(self, other: "Report") -> None:
        self.points += other.points
        self.states += other.states
        self.violations += other.violations
        self.kinds |= other.kinds

    def summary(self, name: str) -> str:
        return (f"{name}: {self.states} crash states at {self.points} crash points, "
                f"{len(self.violations)} violations")


#: (workload name, report) of every exploration in this run, for the terminal summary.
REPORTS: list[tuple[str, Report]] = []


def _kind(label: str) -> str:
    """"fsync a/00000000000000000042.index" -> "fsync *.index" (segment files by class)."""
    kind, _, path = label.partition(" ")
    head, name = os.path.split(path)
    if name[:1].isdigit() and "." in name:
        return f"{kind} *{name[name.index('.'):]}"
    return f"{kind} {path}" if head else f"{kind} {name}"


def _explore_points(points: list[CrashPoint], scratch: str,
                    check: Callable[[str, Any, random.Random], None], seed: int, random_states: int,
                    max_states_per_point: int, max_violations: int) -> Report:
    report = Report()
    with _fileio.install(FileOps()):  # the checks reopen with the real file operations
        _explore_into(report, points, scratch, check, seed, random_states, max_states_per_point, max_violations)
    return report


def _explore_into(report: Report, points: list[CrashPoint], scratch: str,
                  check: Callable[[str, Any, random.Random], None], seed: int, random_states: int,
                  max_states_per_point: int, max_violations: int) -> None:
    for point in points:
        rng = random.Random(seed * 1_000_003 + point.index)
        axes = _axes(point, rng)
        seen: set[bytes] = set()
        report.points += 1
        report.kinds.add(_kind(point.label))
        for choice in _choices(axes, rng, random_states, max_states_per_point):
            image = _image(point, axes, choice)
            digest = _digest(image)
            if digest in seen:
                continue
            seen.add(digest)
            report.states += 1
            _materialise(image, scratch)
            try:
                check(scratch, point.oracle, rng)
            except Exception as exc:  # collect: every violation is reported with its state
                state = ", ".join(f"{a.name}: {a.variants[v][0]}" for a, v in zip(axes, choice) if v) or "durable"
                detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                report.violations.append(f"crash point {point.index} (before {point.label}) "
                                         f"[{state}]: {detail[:600]}")
                if len(report.violations) >= max_violations:
                    return


def explore(points: list[CrashPoint], scratch: str, check: Callable[[str, Any, random.Random], None],
            *, seed: int = 0, random_states: int = 4, max_states_per_point: int = 64, workers: int = 2,
            max_violations: int = 20) -> Report:
    """Check every state of every crash point (see the module docstring); return the report.

    ``check(path, oracle, rng)`` gets a directory holding the rebuilt tree (the recorder's
    root as it would be after the reboot) and raises on a violation. It runs with the plain FileOps, in
    forked worker processes when ``workers`` > 1 (each with its own scratch directory).
    """
    if workers <= 1 or len(points) < 2:
        return _explore_points(points, scratch, check, seed, random_states, max_states_per_point,
                               max_violations)
    children = []
    for w in range(workers):
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the worker
            code = 0
            try:
                os.close(rfd)
                logging.disable(logging.CRITICAL)  # recovery warnings by the thousand
                mine = points[w::workers]
                result = _explore_points(mine, f"{scratch}.{w}", check, seed, random_states,
                                         max_states_per_point, max_violations)
                payload = pickle.dumps(result)
                view = memoryview(payload)
                while view:
                    view = view[os.write(wfd, view):]
            except BaseException:
                traceback.print_exc()
                code = 3
            finally:
                os._exit(code)
        os.close(wfd)
        children.append((pid, rfd))
    report = Report()
    for w, (pid, rfd) in enumerate(children):
        chunks = []
        while chunk := os.read(rfd, 1 << 16):
            chunks.append(chunk)
        os.close(rfd)
        _, status = os.waitpid(pid, 0)
        if status != 0 or not chunks:
            report.violations.append(f"explorer worker {w} died (wait status {status})")
            continue
        report.merge(pickle.loads(b"".join(chunks)))
        shutil.rmtree(f"{scratch}.{w}", ignore_errors=True)
    return report
