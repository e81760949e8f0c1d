#!/usr/bin/env python3
"""logstore against sqlite3, lmdb and persist-queue, same workloads, same run, same machine.

    .venv/bin/python bench/compare.py            # ~2 minutes
    .venv/bin/python bench/compare.py --quick    # ~30 seconds, fewer records, one repetition

Workload (bench/_workload.py): compact JSON values of exactly 200 bytes, 16-byte keys, one
timestamp per record. Every system gets a fresh directory per measurement on the same
filesystem (``LOGSTORE_BENCH_DIR``, default the system temporary directory); only the appends
or the reads are timed, never open/close. Each figure is the median of ``--repeat`` runs.

Workloads and what each system does:

  batch-1000, no fsync   logstore append_batch(1000) | sqlite3 WAL synchronous=NORMAL, one
                         transaction with executemany per batch | lmdb one write txn per batch
                         (putmulti, append=True), sync=False | persist-queue has no batch API:
                         put() per record (marked *)
  batch-1000, fsync      logstore flush_messages=1000 (fdatasync per batch) | sqlite3 WAL
                         synchronous=FULL, commit per batch | lmdb sync=True | persist-queue
                         SQLiteQueue: commit (fsync) per put (*)
  single, no fsync       one record per call: logstore append() | sqlite3 INSERT + commit,
                         NORMAL | lmdb txn per record, sync=False | persistqueue.Queue put() /
                         SQLiteQueue put() with synchronous=NORMAL
  sequential read        everything written above read back in order as (offset, timestamp,
                         key, value) objects: logstore Log.iter() -> Record | sqlite3 SELECT
                         ORDER BY offset -> row tuple | lmdb cursor -> tuple decoded from the
                         value | persist-queue get() + task_done() (a destructive consume)
  read as Arrow          the same records as one Arrow table (key, value, topic, partition,
                         offset, timestamp, timestampType): logstore Log.read_arrow(views=True),
                         keys and values as binary_view columns pointing into the segment file
                         (nothing copied; every batch CRC-checked) | logstore-binary
                         Log.read_arrow(), keys and values copied into binary columns (the
                         default; the "before" of views, interleaved with it) | sqlite3 and
                         lmdb have no columnar read: their sequential read again (every key and
                         value copied into a bytes object)
  random read            one record by offset, at 1 in 10 of the offsets written, in a random
                         order (the same for every system): logstore Log.read(offset,
                         max_records=1)[0] | sqlite3 SELECT ... WHERE "offset" = ? | lmdb
                         txn.get(key) decoded into the four fields; rate = lookups per second.
                         Not quite like for like, in lmdb's favour: a logstore Record carries more
                         (headers, timestamp type, a validated batch: each batch's first read
                         checks its CRC and every record) than lmdb's value bytes cut into four
                         fields. The data is equally cold for all: written just before with pwrite
                         (logstore's append_batch, lmdb's commit), so in the page cache, out of
                         the CPU caches, and not yet mapped into the reading process (each first
                         touch of a page is a minor fault for both; the kernel maps 16 pages per
                         fault for both: ~1,500 faults for logstore, ~1,300 for lmdb). The
                         ratio depends on the lookups per batch: here 100 (500 batches of 1,000
                         records, 50,000 lookups), and each batch's first read validates its
                         230 kB whole (CRC, every record), about 40 us, 0.4 us per lookup. Ten
                         times the log for the same lookups (10 per batch) makes that 4-5 us per
                         lookup, and logstore ~0.4x lmdb; lookups that come back to batches
                         already read (a second pass) cost no validation (each run measures
                         one, printed after the tables)

After the tables (when the random read row ran), where a lookup goes, measured in each run right
after its timed pass: the same lookups made again (pages mapped; logstore's batches remembered as
validated), the per-call floor (one cached record read again and again), what each batch's
validation costs a lookup, and what 1.5x lmdb leaves for finding the record once the floor and
the validation are paid. Then the physical limits measured in the same run (one
core): CRC32C (also split over two threads, as the read as Arrow splits its chunks), memcpy, a
page-cache read through a fresh map, the first touch of fresh memory (every new page faults in;
the copying Arrow table of 500,000 records needs 120 MB of it) and a 230 kB write with fdatasync
(the disk's floor under the fsync row); and how two threads that hand jobs of C to each other
by wake-ups scale (0.5 ms and 2 ms jobs), against two that run without waiting: what the
machine's scheduler gives the read as Arrow's two threads. Every timed read starts after
os.sync(), so that the writeback of the records it reads does not run during it.

Durability differs even inside one row, which is the point of listing it: "no fsync" means
the data is in the OS page cache (survives a process crash, not a power loss) for logstore,
sqlite3 NORMAL (WAL) and lmdb sync=False; persistqueue.Queue fsyncs a chunk file every 100
puts and rewrites its info file per put.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import queue
import random
import sqlite3
import statistics
import sys
import threading
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _workload  # noqa: E402
from logstore import Log  # noqa: E402

try:
    import lmdb
except ImportError:  # pragma: no cover - the bench extra is not installed
    lmdb = None
try:
    import persistqueue
except ImportError:  # pragma: no cover
    persistqueue = None

PAYLOAD = 200
BATCH = 1000
WORKLOADS = ("batch-1000, no fsync", "batch-1000, fsync per batch", "single, no fsync", "sequential read",
             "read as Arrow", "random read")
READS = ("sequential read", "read as Arrow", "random read")
LOOKUP_FRACTION = 10  # random read: count // 10 lookups
SYSTEMS = ("logstore", "logstore-binary", "sqlite3", "lmdb", "pq.Queue", "pq.SQLiteQueue")

# Records per measurement (full run); --quick divides by 5. persist-queue is 10-1000x slower, so
# it gets fewer records; rates are per record, so the counts only set the measurement's length.
COUNTS = {
    ("batch-1000, no fsync", "logstore"): 500_000,
    ("batch-1000, no fsync", "sqlite3"): 200_000,
    ("batch-1000, no fsync", "lmdb"): 500_000,
    ("batch-1000, no fsync", "pq.Queue"): 3_000,
    ("batch-1000, no fsync", "pq.SQLiteQueue"): 5_000,
    ("batch-1000, fsync per batch", "logstore"): 100_000,
    ("batch-1000, fsync per batch", "sqlite3"): 100_000,
    ("batch-1000, fsync per batch", "lmdb"): 100_000,
    ("batch-1000, fsync per batch", "pq.SQLiteQueue"): 500,
    ("single, no fsync", "logstore"): 200_000,
    ("single, no fsync", "sqlite3"): 50_000,
    ("single, no fsync", "lmdb"): 100_000,
    ("single, no fsync", "pq.Queue"): 3_000,
    ("single, no fsync", "pq.SQLiteQueue"): 5_000,
    ("sequential read", "logstore"): 500_000,
    ("sequential read", "sqlite3"): 500_000,
    ("sequential read", "lmdb"): 500_000,
    ("sequential read", "pq.Queue"): 3_000,
    ("sequential read", "pq.SQLiteQueue"): 5_000,
    ("read as Arrow", "logstore"): 500_000,  # only logstore has a columnar read: the others
    ("read as Arrow", "logstore-binary"): 500_000,
    ("read as Arrow", "sqlite3"): 500_000,   # are measured as in "sequential read" (their
    ("read as Arrow", "lmdb"): 500_000,      # fastest way to every record's four fields)
    ("random read", "logstore"): 500_000,
    ("random read", "sqlite3"): 500_000,
    ("random read", "lmdb"): 500_000,
}
# Per system, per run of the random read row, measured right after the timed pass, for the
# lines after the tables: (seconds a lookup in the timed pass, seconds a lookup when the same
# lookups are made again, seconds a call when the first of them is made FLOOR_CALLS times).
PARTS: dict[str, list[tuple[float, float, float]]] = collections.defaultdict(list)
FLOOR_CALLS = 20_000
BATCHED = ("logstore", "logstore-binary", "sqlite3", "lmdb")  # write (and pre-write for reads) in batches of 1000
# Marked with * in the table: no batch API, so the batch rows are per-record puts.
PER_RECORD_ONLY = {("batch-1000, no fsync", "pq.Queue"), ("batch-1000, no fsync", "pq.SQLiteQueue"),
                   ("batch-1000, fsync per batch", "pq.SQLiteQueue")}


class Data:
    def __init__(self, n: int) -> None:
        self.values = _workload.make_values(n, PAYLOAD)
        self.keys = _workload.make_keys(n)
        self.n = n

    def batches(self, count: int) -> list[tuple[list[bytes], list[bytes]]]:
        per_pool = self.n // BATCH
        return [(self.values[(i % per_pool) * BATCH : (i % per_pool + 1) * BATCH],
                 self.keys[(i % per_pool) * BATCH : (i % per_pool + 1) * BATCH]) for i in range(count // BATCH)]

    def pairs(self, count: int) -> list[tuple[bytes, bytes]]:
        return [(self.values[i % self.n], self.keys[i % self.n]) for i in range(count)]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _settled() -> float:
    """The start of a timed read: the writes that set it up are flushed to disk first (os.sync),
    so that the kernel's background writeback of them does not run during the read, then the
    clock is read. Done alike for every system; the pages stay in the page cache."""
    os.sync()
    return time.perf_counter()


def _lookups(count: int) -> list[int]:
    """The offsets a random read looks up: a tenth of them, in one fixed random order."""
    return random.Random(count).sample(range(count), count // LOOKUP_FRACTION)


# ---------------------------------------------------------------------- logstore
def logstore_write(path: str, data: Data, workload: str, count: int) -> float:
    durable = "fsync" in workload and "no fsync" not in workload
    log = Log.open(os.path.join(path, "bench-0"), flush_messages=BATCH if durable else None)
    try:
        if workload.startswith("batch"):
            batches = data.batches(count)
            append_batch = log.append_batch
            t = time.perf_counter()
            for values, keys in batches:
                append_batch(values, keys)
            elapsed = time.perf_counter() - t
        else:
            pairs = data.pairs(count)
            append = log.append
            t = time.perf_counter()
            for value, key in pairs:
                append(value, key)
            elapsed = time.perf_counter() - t
        assert log.log_end_offset == count
    finally:
        log._abandon()  # no close-time fsync: the other systems are not asked to sync either
    return elapsed


def logstore_read(path: str, data: Data, count: int, how: str = "sequential read", views: bool = True) -> float:
    log = Log.open(os.path.join(path, "bench-0"))
    try:
        for values, keys in data.batches(count):
            log.append_batch(values, keys)
        if how == "read as Arrow":
            import logstore.records.arrow  # noqa: F401 - pyarrow's import is not part of the read
        lookups = _lookups(count) if how == "random read" else []
        read = log.read
        t = _settled()
        if how == "read as Arrow":
            assert log.read_arrow(views=views).num_rows == count
        elif how == "random read":
            for offset in lookups:
                read(offset, max_records=1)[0]
        else:
            collections.deque(log.iter(), maxlen=0)
        elapsed = time.perf_counter() - t
        if how == "random read":  # untimed for the row: where a lookup goes (PARTS)
            t = time.perf_counter()
            for offset in lookups:
                read(offset, max_records=1)[0]
            again = time.perf_counter() - t
            offset = lookups[0]
            t = time.perf_counter()
            for _ in range(FLOOR_CALLS):
                read(offset, max_records=1)[0]
            PARTS["logstore"].append((elapsed / len(lookups), again / len(lookups), (time.perf_counter() - t) / FLOOR_CALLS))
    finally:
        log._abandon()
    return elapsed


def logstore_read_binary(path: str, data: Data, count: int, how: str = "sequential read") -> float:
    """logstore_read with read_arrow's default binary columns (keys and values copied)."""
    return logstore_read(path, data, count, how, views=False)


COLUMNAR = (logstore_read, logstore_read_binary)


# ---------------------------------------------------------------------- sqlite3
_SQL_CREATE = 'CREATE TABLE records ("offset" INTEGER PRIMARY KEY, key BLOB, value BLOB, ts INTEGER)'
_SQL_INSERT = 'INSERT INTO records ("offset", key, value, ts) VALUES (?, ?, ?, ?)'


def _sqlite(path: str, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(os.path.join(path, "bench.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute(_SQL_CREATE)
    return conn


def sqlite_write(path: str, data: Data, workload: str, count: int) -> float:
    durable = "fsync" in workload and "no fsync" not in workload
    conn = _sqlite(path, "FULL" if durable else "NORMAL")
    execute, executemany = conn.execute, conn.executemany
    try:
        if workload.startswith("batch"):
            batches = data.batches(count)
            t = time.perf_counter()
            offset = 0
            for values, keys in batches:
                ts = _now_ms()
                execute("BEGIN")
                executemany(_SQL_INSERT, [(offset + i, k, v, ts) for i, (k, v) in enumerate(zip(keys, values))])
                execute("COMMIT")
                offset += len(values)
            elapsed = time.perf_counter() - t
        else:
            pairs = data.pairs(count)
            t = time.perf_counter()
            for offset, (value, key) in enumerate(pairs):
                execute(_SQL_INSERT, (offset, key, value, _now_ms()))  # autocommit: one txn each
            elapsed = time.perf_counter() - t
    finally:
        conn.close()
    return elapsed


def sqlite_read(path: str, data: Data, count: int, how: str = "sequential read") -> float:
    conn = _sqlite(path, "NORMAL")
    offset = 0
    for values, keys in data.batches(count):
        ts = _now_ms()
        conn.execute("BEGIN")
        conn.executemany(_SQL_INSERT, [(offset + i, k, v, ts) for i, (k, v) in enumerate(zip(keys, values))])
        conn.execute("COMMIT")
        offset += len(values)
    try:
        if how == "random read":
            lookups = _lookups(count)
            execute = conn.execute
            query = 'SELECT "offset", ts, key, value FROM records WHERE "offset" = ?'
            t = _settled()
            for offset in lookups:
                execute(query, (offset,)).fetchone()
        else:
            t = _settled()
            collections.deque(conn.execute('SELECT "offset", ts, key, value FROM records ORDER BY "offset"'), maxlen=0)
        elapsed = time.perf_counter() - t
    finally:
        conn.close()
    return elapsed


# ---------------------------------------------------------------------- lmdb
def _lmdb(path: str, sync: bool):
    return lmdb.open(os.path.join(path, "bench.lmdb"), map_size=8 << 30, sync=sync, metasync=sync,
                     max_dbs=0, readahead=False)


def _lmdb_item(offset: int, ts: bytes, key: bytes, value: bytes) -> tuple[bytes, bytes]:
    return offset.to_bytes(8, "big"), ts + key + value


def lmdb_write(path: str, data: Data, workload: str, count: int) -> float:
    durable = "fsync" in workload and "no fsync" not in workload
    env = _lmdb(path, durable)
    try:
        if workload.startswith("batch"):
            batches = data.batches(count)
            t = time.perf_counter()
            offset = 0
            for values, keys in batches:
                ts = _now_ms().to_bytes(8, "big")
                with env.begin(write=True) as txn:
                    txn.cursor().putmulti([((offset + i).to_bytes(8, "big"), ts + k + v)
                                           for i, (k, v) in enumerate(zip(keys, values))], append=True)
                offset += len(values)
            elapsed = time.perf_counter() - t
        else:
            pairs = data.pairs(count)
            begin = env.begin
            t = time.perf_counter()
            for offset, (value, key) in enumerate(pairs):
                with begin(write=True) as txn:
                    txn.put(offset.to_bytes(8, "big"), _now_ms().to_bytes(8, "big") + key + value, append=True)
            elapsed = time.perf_counter() - t
    finally:
        env.close()
    return elapsed


def lmdb_read(path: str, data: Data, count: int, how: str = "sequential read") -> float:
    env = _lmdb(path, False)
    offset = 0
    for values, keys in data.batches(count):
        ts = _now_ms().to_bytes(8, "big")
        with env.begin(write=True) as txn:
            txn.cursor().putmulti([((offset + i).to_bytes(8, "big"), ts + k + v)
                                   for i, (k, v) in enumerate(zip(keys, values))], append=True)
        offset += len(values)
    try:
        from_bytes = int.from_bytes
        if how == "random read":
            keys = [offset.to_bytes(8, "big") for offset in _lookups(count)]
            t = _settled()
            with env.begin(buffers=False) as txn:
                get = txn.get
                for k in keys:
                    v = get(k)
                    (from_bytes(k, "big"), from_bytes(v[:8], "big"), v[8:24], v[24:])
                elapsed = time.perf_counter() - t
                t = time.perf_counter()  # untimed for the row: where a lookup goes (PARTS)
                for k in keys:
                    v = get(k)
                    (from_bytes(k, "big"), from_bytes(v[:8], "big"), v[8:24], v[24:])
                again = time.perf_counter() - t
                k = keys[0]
                t = time.perf_counter()
                for _ in range(FLOOR_CALLS):
                    v = get(k)
                    (from_bytes(k, "big"), from_bytes(v[:8], "big"), v[8:24], v[24:])
                PARTS["lmdb"].append((elapsed / len(keys), again / len(keys), (time.perf_counter() - t) / FLOOR_CALLS))
            return elapsed
        t = _settled()
        with env.begin(buffers=False) as txn:
            collections.deque(((from_bytes(k, "big"), from_bytes(v[:8], "big"), v[8:24], v[24:])
                               for k, v in txn.cursor()), maxlen=0)
        elapsed = time.perf_counter() - t
    finally:
        env.close()
    return elapsed


# ---------------------------------------------------------------------- persist-queue
def _pq(path: str, system: str, durable: bool):
    qpath = os.path.join(path, "queue")
    if system == "pq.Queue":
        return persistqueue.Queue(qpath, tempdir=path)
    q = persistqueue.SQLiteQueue(qpath, auto_commit=True)
    if not durable:
        q._putter.execute("PRAGMA synchronous=NORMAL")  # its default in WAL mode is FULL
    return q


def pq_write(system: str) -> Callable[[str, Data, str, int], float]:
    def write(path: str, data: Data, workload: str, count: int) -> float:
        durable = "fsync" in workload and "no fsync" not in workload
        q = _pq(path, system, durable)
        pairs = data.pairs(count)
        put = q.put
        t = time.perf_counter()
        for value, key in pairs:
            put((_now_ms(), key, value))
        elapsed = time.perf_counter() - t
        if system == "pq.SQLiteQueue":
            q.close()
        return elapsed

    return write


def pq_read(system: str) -> Callable[..., float]:
    def read(path: str, data: Data, count: int, how: str = "sequential read") -> float:
        # a queue reads only in order: the sequential read is the one workload it has (COUNTS)
        q = _pq(path, system, durable=False)
        for value, key in data.pairs(count):
            q.put((_now_ms(), key, value))
        get, task_done = q.get, q.task_done
        t = _settled()
        for _ in range(count):
            get()
            task_done()
        elapsed = time.perf_counter() - t
        if system == "pq.SQLiteQueue":
            q.close()
        return elapsed

    return read


# ---------------------------------------------------------------------- driver
def runners() -> dict[str, tuple[Callable, Callable] | None]:
    out: dict[str, tuple[Callable, Callable] | None] = {
        "logstore": (logstore_write, logstore_read),
        "logstore-binary": (logstore_write, logstore_read_binary),
        "sqlite3": (sqlite_write, sqlite_read),
        "lmdb": (lmdb_write, lmdb_read) if lmdb else None,
    }
    for system in ("pq.Queue", "pq.SQLiteQueue"):
        out[system] = (pq_write(system), pq_read(system)) if persistqueue else None
    return out


def measure_once(workload: str, fns, data: Data, count: int) -> float:
    write, read = fns
    with _workload.scratch_dir("logstore-compare-") as path:
        if workload == "read as Arrow" and read not in COLUMNAR:
            elapsed = read(path, data, count)  # no columnar read: the sequential one
        elif workload in READS:
            elapsed = read(path, data, count, workload)
        else:
            elapsed = write(path, data, workload, count)
    return (count // LOOKUP_FRACTION if workload == "random read" else count) / elapsed


def _best(fn: Callable[[], None], rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def physical_limits() -> None:
    """What this machine allows, measured in the same run (one core, best of 3): the bounds
    under the read and write figures above."""
    import ctypes
    import mmap

    from logstore._native import ffi, lib

    size = 64 << 20
    src = os.urandom(size)
    dst = bytearray(size)  # touched: the copy measures memcpy, not page faults
    crc = _best(lambda: lib.ls_crc32c(0, src, size))
    whole, half = ffi.from_buffer(src), size // 2

    def crc_on_two() -> None:  # the read as Arrow's split: each thread CRCs half (cffi lets the GIL go)
        other = threading.Thread(target=lib.ls_crc32c, args=(0, whole + half, size - half))
        other.start()
        lib.ls_crc32c(0, whole, half)
        other.join()

    crc2 = _best(crc_on_two)
    copy = _best(lambda: ctypes.memmove((ctypes.c_char * size).from_buffer(dst), src, size))

    def first_touch() -> None:
        m = mmap.mmap(-1, size)
        m[:] = src  # every page faulted in for the first time
        m.close()

    touch = _best(first_touch)
    handed_short, _ = _fork_join(0.0005)
    handed, free = _fork_join(0.002)
    with _workload.scratch_dir("logstore-limits-") as path:
        name = os.path.join(path, "f")
        with open(name, "wb") as f:
            f.write(src * 4)
        fd = os.open(name, os.O_RDONLY)
        try:
            def cached_read() -> None:  # as a reader does: a fresh map of the file, every byte read
                m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
                p = ffi.from_buffer(m)
                lib.ls_crc32c(0, p, len(m))
                ffi.release(p)
                m.close()
            cached = _best(cached_read)  # the file was just written: it is in the page cache
        finally:
            os.close(fd)
        wfd = os.open(os.path.join(path, "g"), os.O_WRONLY | os.O_CREAT)
        piece = src[:230_000]  # one batch of the fsync row
        try:
            def write_sync() -> None:
                for i in range(20):
                    os.pwrite(wfd, piece, i * len(piece))
                    os.fdatasync(wfd)
            sync = _best(write_sync) / 20
        finally:
            os.close(wfd)
    gb = 1e9
    print("physical limits (one core unless said, best of 3, this run):")
    print(f"  CRC32C {size / crc / gb:.1f} GB/s (two threads: {size / crc2 / gb:.1f} GB/s), memcpy {size / copy / gb:.1f} GB/s, page-cache read "
          f"(fresh map, CRC'd) {4 * size / cached / gb:.1f} GB/s, first touch of fresh memory {size / touch / gb:.2f} GB/s, "
          f"write + fdatasync of 230 kB {sync * 1e3:.2f} ms")
    print(f"  two threads handing jobs of C over by wake-ups, as the read as Arrow hands its chunk pairs: {handed_short:.2f}x "
          f"one thread with 0.5 ms jobs, {handed:.2f}x with 2 ms jobs (free-running, no hand-offs: {free:.2f}x; median of 5)")
    print()


def _fork_join(seconds: float, pairs: int = 16, rounds: int = 5) -> tuple[float, float]:
    """The speed-up of two threads over one on 2 x ``pairs`` jobs of C of about ``seconds``
    each (sha256, the GIL let go), (a) handed over in pairs, the second job of each pair to a
    waiting helper thread woken for it, as read_arrow's chunk pairs are, and (b) two threads
    each running its half without waiting for the other. (b) is what two cores allow; (a) is
    what this machine's scheduler gives threads that hand work to each other (a scheduler that
    keeps a woken thread on its waker's CPU runs the pair one after the other: ~1x)."""
    data = os.urandom(1 << 20)
    per = _best(lambda: hashlib.sha256(data).digest())
    data = os.urandom(max(1 << 12, int((1 << 20) * seconds / max(per, 1e-6))))

    def job() -> None:
        hashlib.sha256(data).digest()

    def serial() -> float:
        t = time.perf_counter()
        for _ in range(2 * pairs):
            job()
        return time.perf_counter() - t

    def handed() -> float:
        jobs: queue.SimpleQueue[bool] = queue.SimpleQueue()
        done: queue.SimpleQueue[bool] = queue.SimpleQueue()

        def helper() -> None:
            while jobs.get():
                job()
                done.put(True)
        thread = threading.Thread(target=helper)
        thread.start()
        time.sleep(0.05)  # the helper asleep, waiting, as between two reads
        t = time.perf_counter()
        for _ in range(pairs):
            jobs.put(True)
            job()
            done.get()
        elapsed = time.perf_counter() - t
        jobs.put(False)
        thread.join()
        return elapsed

    def free() -> float:
        threads = [threading.Thread(target=lambda: [job() for _ in range(pairs)]) for _ in range(2)]
        t = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - t

    a, b = [], []
    for _ in range(rounds):
        one = serial()
        a.append(one / handed())
        b.append(one / free())
    return statistics.median(a), statistics.median(b)


def random_read_parts() -> None:
    """Where a lookup of the random read row goes, measured in each run right after its timed
    pass: the same lookups made again (the pages mapped; logstore's batches remembered as
    validated: no CRC or walk of a whole batch), and the floor of a call (the first lookup's
    record read again and again: every line in the CPU's caches). The timed pass's extra over
    the second is, for lmdb, the first mapping of the pages it touches; for logstore the same plus
    each batch's validation on its first read. What 1.5x lmdb leaves for logstore's lookup is
    set against what its floor and that validation take."""
    parts = {name: tuple(statistics.median(run[i] for run in runs) for i in range(3))
             for name, runs in PARTS.items() if runs}
    if "logstore" not in parts or "lmdb" not in parts:
        return
    us = 1e6
    print("random read, a lookup (medians of the runs): timed pass / the same lookups again / floor (one cached record)")
    for name, (first, again, floor) in parts.items():
        print(f"  {name:<9} {first * us:.2f} / {again * us:.2f} / {floor * us:.2f} us "
              f"(above the floor: {(first - floor) * us:.2f} / {(again - floor) * us:.2f} us)")
    (mine, mine_again, mine_floor), (theirs, theirs_again, theirs_floor) = parts["logstore"], parts["lmdb"]
    validation = max(0.0, (mine - mine_again) - (theirs - theirs_again))
    print(f"  logstore's validation of each batch on its first read, a lookup's share: {validation * us:.2f} us "
          f"(its timed pass's extra over the second, {(mine - mine_again) * us:.2f} us, less lmdb's, "
          f"{(theirs - theirs_again) * us:.2f} us: the first mapping of the pages, alike for both)")
    goal, paid = theirs / 1.5, mine_floor + validation
    left = (f"leaving {(goal - paid) * us:.2f} us for finding the record in memory" if paid < goal
            else "more than all of it: out of reach in these runs whatever finding the record costs")
    print(f"  1.5x lmdb needs a logstore lookup of {goal * us:.2f} us; its floor and the validation take "
          f"{paid * us:.2f} us, {left} (logstore's lookup spends {(mine_again - mine_floor) * us:.2f} us above its "
          f"floor with its batches remembered, lmdb's {(theirs_again - theirs_floor) * us:.2f} us with its pages mapped)")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1/5 of the records, one repetition (~30 s)")
    parser.add_argument("--repeat", type=int, default=None, help="runs per figure (median); default 3, quick 1")
    parser.add_argument("--only", default=None, help="comma-separated systems to run (logstore and logstore-binary always run)")
    parser.add_argument("--workloads", default=None,
                        help="comma-separated workloads to run, by name or a part of it (e.g. 'random,Arrow')")
    args = parser.parse_args(argv)
    workloads = [w for w in WORKLOADS
                 if args.workloads is None or any(part in w for part in args.workloads.split(","))]
    if not workloads:
        parser.error(f"no workload matches {args.workloads!r}; workloads: {', '.join(WORKLOADS)}")
    repeat = args.repeat or (1 if args.quick else 3)
    scale = 5 if args.quick else 1
    systems = [s for s in SYSTEMS if args.only is None or s.startswith("logstore") or s in args.only.split(",")]

    load_start = os.getloadavg()[0]
    print("logstore vs sqlite3 / lmdb / persist-queue: 200-byte JSON values, 16-byte keys")
    for line in _workload.machine_lines():
        print(line)
    versions = [f"sqlite {sqlite3.sqlite_version}"]
    if lmdb:
        versions.append(f"lmdb {'.'.join(map(str, lmdb.version()))} (py-lmdb {lmdb.__version__})")
    if persistqueue:
        versions.append(f"persist-queue {persistqueue.__version__}")
    print(f"{'versions':>9}: " + ", ".join(versions))
    print(f"{'runs':>9}: median of {repeat}{', --quick (1/5 of the records)' if args.quick else ''}")
    print()

    fns = runners()
    data = Data(300_000)  # distinct values: none is reused before 300,000 records
    results: dict[tuple[str, str], float | None] = {}
    started = time.perf_counter()
    # Repetitions go round-robin over the systems, so that a burst of load from elsewhere on the
    # machine hits every system of a workload alike instead of one system's whole median.
    for workload in workloads:
        runnable = {}
        for system in systems:
            count = COUNTS.get((workload, system))
            if fns.get(system) is None or count is None:
                results[(workload, system)] = None
                continue
            runnable[system] = (max(BATCH, count // scale // BATCH * BATCH) if system in BATCHED
                                else max(100, count // scale))
        rates: dict[str, list[float]] = {system: [] for system in runnable}
        for _ in range(repeat):
            for system, count in runnable.items():
                rates[system].append(measure_once(workload, fns[system], data, count))
        for system, count in runnable.items():
            rate = results[(workload, system)] = statistics.median(rates[system])
            spread = (f"runs {_workload.fmt_rate(min(rates[system]))}..{_workload.fmt_rate(max(rates[system]))}, "
                      if repeat > 1 else "")
            print(f"  {workload:<28} {system:<15} {_workload.fmt_rate(rate):>8} records/s  "
                  f"({spread}{count:,} records each)", flush=True)
    print()

    width = 16
    print("records/s (* = per-record puts: persist-queue has no batch API; - = not applicable)")
    print(f"{'workload':<28}" + "".join(f"{s:>{width}}" for s in systems))
    for workload in workloads:
        cells = []
        for system in systems:
            rate = results.get((workload, system))
            mark = "*" if (workload, system) in PER_RECORD_ONLY else ""
            cells.append(f"{(_workload.fmt_rate(rate) + mark) if rate else '-':>{width}}")
        print(f"{workload:<28}" + "".join(cells))
    print()
    print("logstore's speed-up over each (logstore records/s / theirs)")
    others = [s for s in systems if s != "logstore"]
    print(f"{'workload':<28}" + "".join(f"{s:>{width}}" for s in others))
    for workload in workloads:
        mine = results.get((workload, "logstore"))
        cells = []
        for system in others:
            theirs = results.get((workload, system))
            cells.append(f"{(f'{mine / theirs:.1f}x') if mine and theirs else '-':>{width}}")
        print(f"{workload:<28}" + "".join(cells))
    print()
    if "random read" in workloads:
        random_read_parts()
    physical_limits()
    print(f"elapsed {time.perf_counter() - started:.0f} s; load average {load_start:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end ({os.cpu_count()} cores; above ~1 the figures are disturbed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
