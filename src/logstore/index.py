"""A segment's indexes: Kafka's ``.index``, ``.timeindex`` and ``.txnindex`` files.

An index is a sorted array of fixed-size big-endian entries in a memory-mapped file:

* OffsetIndex (``NNN.index``), 8-byte entries ``(relative offset int32, position int32)``: the
  batch whose last offset is ``base + relative offset`` starts at ``position`` of the ``.log``.
* TimeIndex (``NNN.timeindex``), 12-byte entries ``(timestamp int64, relative offset int32)``:
  no record at an offset below ``base + relative offset`` has a timestamp larger than
  ``timestamp``, so the search for the first record with timestamp >= t may start at the batch
  holding that offset, for the largest entry whose timestamp <= t.

While a segment is active its indexes are preallocated to ``segment_index_bytes`` (sparse files,
zero tail) and written by the C appender through the map; when the segment rolls they are trimmed
to their entries and remapped read-only. Indexes are derived data: a missing, truncated or
non-monotonic index fails :meth:`sanity_check` and recovery rebuilds it from the log.

Lookups are floor searches done in C (``ls_index_lookup``/``ls_timeindex_lookup``) over the whole
map. Kafka's AbstractIndex keeps a "warm section" so that tail lookups touch few pages; with the
index resident in the page cache a plain binary search over at most 1.3 M entries costs ~21
probes, which we found to be well under a microsecond, so we keep the simpler search.

The third, TransactionIndex (``NNN.txnindex``), is not sparse: one 34-byte entry per aborted
transaction whose ABORT marker lies in the segment (see :class:`TransactionIndex`).

Thread-safety: not thread-safe; the owning LogSegment's Log serialises access.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any, NamedTuple

from . import _fileio
from ._native import ffi, lib
from .errors import CorruptIndexError

__all__ = ["OffsetIndex", "TimeIndex", "TransactionIndex", "AbortedTxn", "AbortedBatches", "parse_txn_entries",
           "offset_index_lookup", "time_index_lookup", "collect_aborted"]


class _Index:
    entry_size: int = 0
    is_time: int = 0
    suffix: str = ""

    def __init__(self, path: str, base_offset: int, max_index_size: int, writable: bool) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_index_size = max_index_size
        self.writable = False
        self._fd = -1
        self._mm: mmap.mmap | None = None
        self._ptr: Any = ffi.NULL
        self.entries = 0
        self.capacity = 0
        self._reserved = 0
        flags = os.O_RDWR | os.O_CREAT
        self._fd = _fileio.ops.open(path, flags)
        size = _fileio.ops.fsize(self._fd)
        #: A file whose size is not a whole number of entries was cut by a crash or a foreign
        #: tool; Kafka treats it as corrupt. sanity_check() reports it and recovery rebuilds.
        self.partial_entry = size % self.entry_size != 0
        size -= size % self.entry_size
        self.entries = size // self.entry_size
        if writable:
            self.make_writable()
        else:
            self._map(size, False)

    @classmethod
    def open_readonly(cls, path: str, base_offset: int) -> "Any":
        """Read an index file without changing anything (readers in other processes, see
        logview.py): a copy of its written part; None when the file does not exist. The
        entries are the leading non-zero ones (an active index is preallocated with a zero
        tail); an index failing the sanity check reads as empty, since an index is only a hint
        that readers verify."""
        ops = _fileio.ops
        try:
            fd = ops.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        self = cls.__new__(cls)
        self.path, self.base_offset, self.max_index_size = path, base_offset, 0
        self.writable, self._fd, self._mm, self._ptr = False, fd, None, ffi.NULL
        self.entries = self.capacity = self._reserved = 0
        try:
            # A copy of the written part, not a map: the owner trims an active index when its
            # segment rolls, and a map of a file cut meanwhile is a SIGBUS where it is touched
            # past the new end (the scan for the zero tail reads one entry past the last).
            size = min(ops.fsize(fd), ops.data_end(fd))
            data = ops.pread(fd, size, 0) if size > 0 else b""
            self.partial_entry = len(data) % self.entry_size != 0
            data = data[:len(data) - len(data) % self.entry_size]
            self.capacity = len(data) // self.entry_size
            if data:
                self._mm = data  # type: ignore[assignment]
                self._ptr = ffi.from_buffer(data)
            if self.capacity:
                self.entries = lib.ls_index_entries(self._ptr, self.capacity, self.is_time)
            if self.entries and lib.ls_index_check(self._ptr, self.entries, self.is_time, 2**31 - 1) != -1:
                self.entries = 0
        except BaseException:
            self.close()
            raise
        return self

    # ------------------------------------------------------------------ mapping
    def _unmap(self) -> None:
        if self._ptr is not ffi.NULL:
            ffi.release(self._ptr)
            self._ptr = ffi.NULL
        if self._mm is not None:
            if isinstance(self._mm, mmap.mmap):
                self._mm.close()
            self._mm = None

    def _map(self, size: int, writable: bool) -> None:
        self._unmap()
        self.writable = writable
        self.capacity = size // self.entry_size
        if size > 0:
            self._mm = _fileio.ops.mmap(self._fd, size, writable)
            if writable:
                # A writable index is a preallocated sparse file (max_index_size, 10 MiB by
                # default) whose entries arrive one page per ~340 index intervals. Without this a
                # fault on its next page reads around it (up to read_ahead_kb: 8 MiB here), so
                # the append that stored a segment's first entry zero-filled 8 MiB of page cache
                # for each of the two indexes (16-140 ms on this VM, measured: a stall of every
                # producer of the partition). MADV_RANDOM faults in the one page stored into.
                try:
                    self._mm.madvise(mmap.MADV_RANDOM)
                except (AttributeError, OSError, ValueError):  # pragma: no cover - not on every platform
                    pass
            self._ptr = ffi.from_buffer(self._mm)

    def make_writable(self) -> None:
        """Preallocate to max_index_size and map writable (the segment becomes active).

        The entry count of a preallocated file is found by scanning for its zero tail, so an
        active index that was never trimmed (crash) reopens with the entries it had.
        """
        size = max(self.max_index_size - self.max_index_size % self.entry_size, self.entry_size)
        current = _fileio.ops.fsize(self._fd)
        # Entries can only be in the part written before: up to the old size and the first
        # hole. The scan must not touch the rest (a hole read through the map would allocate
        # a page on tmpfs, which on a full tmpfs is a SIGBUS).
        written = min(current, _fileio.ops.data_end(self._fd))
        if current > size:
            size = current - current % self.entry_size
        if current != size:
            _fileio.ops.ftruncate(self._fd, size)  # sparse: costs no disk until written
        self.partial_entry = False
        self._reserved = 0
        self._map(size, True)
        self.entries = lib.ls_index_entries(self._ptr, min(self.capacity, written // self.entry_size), self.is_time)

    def reload_sealed(self) -> None:
        """Map the file read-only as it is now on disk (another process trimmed it when the
        segment rolled)."""
        self._unmap()
        size = _fileio.ops.fsize(self._fd)
        self.partial_entry = size % self.entry_size != 0
        size -= size % self.entry_size
        self.entries = size // self.entry_size
        self._map(size, False)

    def trim(self) -> None:
        """Shrink the file to its entries and map it read-only (the segment rolled)."""
        size = self.entries * self.entry_size
        self._unmap()
        _fileio.ops.ftruncate(self._fd, size)
        self.partial_entry = False
        self._map(size, False)

    @property
    def data(self) -> Any:
        """The mapped entries (an mmap, or bytes for a read-only copy), None when empty."""
        return self._mm

    @property
    def pointer(self) -> Any:
        """The cffi pointer to the mapped entries (for the C appender and scan)."""
        return self._ptr

    @property
    def is_full(self) -> bool:
        return self.entries >= self.capacity

    @property
    def size_bytes(self) -> int:
        return self.entries * self.entry_size

    # ------------------------------------------------------------------ checks and maintenance
    def sanity_check(self, max_relative_offset: int = 2**31 - 1) -> None:
        """Raise CorruptIndexError unless entries are sorted and relative offsets are in range."""
        if self.partial_entry:
            raise CorruptIndexError(self.path, f"file size is not a multiple of {self.entry_size} bytes")
        if self.entries > self.capacity:
            raise CorruptIndexError(self.path, f"{self.entries} entries exceed the file's {self.capacity}")
        if self.entries == 0:
            return
        bad = lib.ls_index_check(self._ptr, self.entries, self.is_time, max_relative_offset)
        if bad >= 0:
            raise CorruptIndexError(
                self.path, f"entry {bad} is out of order or out of range (of {self.entries} entries)"
            )

    def reserve(self, entries: int) -> None:
        """Allocate disk blocks for the first ``entries`` slots of a writable index.

        A preallocated index is a sparse file, and a store into an unallocated page of its map
        on a full disk kills the process with SIGBUS. The owner reserves room ahead of the
        appender (as the ``.log`` is reserved), so that a full disk surfaces here, as ENOSPC.
        """
        if not self.writable:
            return
        # In whole pages: the first store into a page of the map allocates every block of the
        # page (on ext4 under 512 MiB a block is 1 KiB), not only the one the entry is in.
        size = min(entries, self.capacity) * self.entry_size
        size = min(-(-size // mmap.PAGESIZE) * mmap.PAGESIZE, self.capacity * self.entry_size)
        if size > self._reserved:
            _fileio.ops.fallocate(self._fd, size)
            self._reserved = size

    def reset(self) -> None:
        """Drop every entry and every stale byte (before a rebuild), keeping the mapping mode.

        The file is cut to zero length first, so that entries of an earlier life of this index
        can never reappear behind the rebuilt ones if we crash before the next trim.
        """
        writable = self.writable
        self._unmap()
        _fileio.ops.ftruncate(self._fd, 0)
        self.entries = 0
        self.partial_entry = False
        if writable:
            self.make_writable()
        else:
            self._map(0, False)

    def flush(self) -> None:
        """fsync the index file (durability of derived data shortens recovery only)."""
        _fileio.ops.fsync(self._fd)

    def close(self) -> None:
        """Unmap and close; the file stays as it is."""
        self._unmap()
        if self._fd >= 0:
            _fileio.ops.close(self._fd)
            self._fd = -1

    def rename_to(self, path: str) -> None:
        _fileio.ops.rename(self.path, path)
        self.path = path

    def _truncate_entries(self, keep: int) -> None:
        """Keep the first ``keep`` entries: zero the rest of a writable map (so that they cannot
        be counted back after a crash), or cut the file of a sealed index."""
        if keep >= self.entries:
            return
        if self.writable and self._mm is not None:
            self._mm[keep * self.entry_size : self.entries * self.entry_size] = bytes((self.entries - keep) * self.entry_size)
            self.entries = keep
        else:
            self.entries = keep
            self.trim()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}, entries={self.entries})"


class OffsetIndex(_Index):
    """OffsetIndex owns NNN.index: (relative offset, position) entries, sorted by offset.

    Not thread-safe; the owning segment's Log serialises access.
    """

    entry_size = lib.LS_INDEX_ENTRY_SIZE
    is_time = 0
    suffix = ".index"

    def entry(self, slot: int) -> tuple[int, int]:
        """Return (absolute offset, position) of ``slot``."""
        raw = self._mm[slot * 8 : slot * 8 + 8]  # type: ignore[index]
        return self.base_offset + int.from_bytes(raw[:4], "big", signed=True), int.from_bytes(raw[4:], "big", signed=True)

    def lookup(self, offset: int) -> tuple[int, int]:
        """Return (offset, position) of the largest entry whose offset <= ``offset``.

        With no such entry, returns (base_offset, 0): the scan starts at the segment's start.
        """
        if self.entries == 0:
            return self.base_offset, 0
        rel = offset - self.base_offset
        if rel < 0:
            return self.base_offset, 0
        slot = lib.ls_index_lookup(self._ptr, self.entries, min(rel, 2**31 - 1))
        if slot < 0:
            return self.base_offset, 0
        return self.entry(slot)

    def last_entry(self) -> tuple[int, int]:
        """(offset, position) of the last entry, or (base_offset, 0) when empty."""
        return self.entry(self.entries - 1) if self.entries else (self.base_offset, 0)

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset >= ``offset``."""
        if self.entries == 0:
            return
        slot = lib.ls_index_lookup(self._ptr, self.entries, max(-1, min(offset - self.base_offset, 2**31 - 1)))
        # slot is the largest entry <= offset; an entry equal to offset goes too.
        keep = slot + 1
        if keep > 0 and self.entry(slot)[0] >= offset:
            keep -= 1
        self._truncate_entries(max(keep, 0))


def offset_index_lookup(data: bytes, base_offset: int, offset: int) -> tuple[int, int]:
    """:meth:`OffsetIndex.lookup` over an index file's bytes (a remote segment's ``.index``):
    (offset, position) of the largest entry whose offset <= ``offset``, (base_offset, 0) when
    none is. A partial trailing entry is ignored. Thread-safe."""
    entries = len(data) // lib.LS_INDEX_ENTRY_SIZE
    rel = offset - base_offset
    if not entries or rel < 0:
        return base_offset, 0
    slot = lib.ls_index_lookup(ffi.from_buffer(data), entries, min(rel, 2**31 - 1))
    if slot < 0:
        return base_offset, 0
    raw = data[slot * 8:slot * 8 + 8]
    return base_offset + int.from_bytes(raw[:4], "big", signed=True), int.from_bytes(raw[4:], "big", signed=True)


def time_index_lookup(data: bytes, base_offset: int, timestamp: int) -> tuple[int, int]:
    """:meth:`TimeIndex.lookup` over an index file's bytes (a remote segment's ``.timeindex``):
    (timestamp, offset) of the largest entry whose timestamp <= ``timestamp``, (-1, base_offset)
    when none is. Thread-safe."""
    entries = len(data) // lib.LS_TIMEINDEX_ENTRY_SIZE
    if not entries:
        return -1, base_offset
    slot = lib.ls_timeindex_lookup(ffi.from_buffer(data), entries, timestamp)
    if slot < 0:
        return -1, base_offset
    raw = data[slot * 12:slot * 12 + 12]
    return int.from_bytes(raw[:8], "big", signed=True), base_offset + int.from_bytes(raw[8:], "big", signed=True)


class TimeIndex(_Index):
    """TimeIndex owns NNN.timeindex: (timestamp, relative offset) entries, sorted by both.

    Not thread-safe; the owning segment's Log serialises access.
    """

    entry_size = lib.LS_TIMEINDEX_ENTRY_SIZE
    is_time = 1
    suffix = ".timeindex"

    def entry(self, slot: int) -> tuple[int, int]:
        """Return (timestamp, absolute offset) of ``slot``."""
        raw = self._mm[slot * 12 : slot * 12 + 12]  # type: ignore[index]
        return int.from_bytes(raw[:8], "big", signed=True), self.base_offset + int.from_bytes(raw[8:], "big", signed=True)

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """Return (timestamp, offset) of the largest entry whose timestamp <= ``timestamp``.

        With no such entry returns (-1, base_offset): the scan starts at the segment's start.
        """
        if self.entries == 0:
            return -1, self.base_offset
        slot = lib.ls_timeindex_lookup(self._ptr, self.entries, timestamp)
        if slot < 0:
            return -1, self.base_offset
        return self.entry(slot)

    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (-1, base_offset) when empty."""
        return self.entry(self.entries - 1) if self.entries else (-1, self.base_offset)

    def append(self, timestamp: int, offset: int) -> bool:
        """Add (timestamp, offset) to a writable index if the timestamp is newer than the last
        entry's and there is room (the closing entry of a rebuilt index); True if added."""
        if not self.writable or self.entries >= self.capacity:
            return False
        if self.entries and timestamp <= self.entry(self.entries - 1)[0]:
            return False
        slot = self.entries * self.entry_size
        self._mm[slot : slot + 8] = timestamp.to_bytes(8, "big", signed=True)  # type: ignore[index]
        self._mm[slot + 8 : slot + 12] = (offset - self.base_offset).to_bytes(4, "big", signed=True)  # type: ignore[index]
        self.entries += 1
        return True

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset >= ``offset``."""
        keep = self.entries
        while keep > 0 and self.entry(keep - 1)[1] >= offset:
            keep -= 1
        self._truncate_entries(keep)


class AbortedTxn(NamedTuple):
    """One aborted transaction (immutable): its producer, the offset of its first record, the
    offset of its ABORT marker, and the log's last stable offset once it was aborted (Kafka's
    AbortedTxn)."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class AbortedBatches:
    """Which batches a set of aborted transactions covers (the one statement of Kafka's rule for
    read_committed readers and the cleaner): a transactional data batch (not a marker) of an
    entry's producer whose base offset lies between the entry's first offset and its ABORT
    marker. Immutable once made; thread-safe.

    >>> aborted = AbortedBatches([AbortedTxn(7, 3, 10, 11)])
    >>> bool(aborted), aborted.covers(7, 5, 0x10), aborted.covers(7, 12, 0x10), aborted.covers(7, 5, 0)
    (True, True, False, False)
    """

    __slots__ = ("_by_producer",)

    def __init__(self, txns: "list[AbortedTxn]") -> None:
        self._by_producer: dict[int, list[tuple[int, int]]] = {}
        for txn in txns:
            self._by_producer.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))

    def __bool__(self) -> bool:
        return bool(self._by_producer)

    def covers(self, producer_id: int, base_offset: int, attributes: int) -> bool:
        """Whether the batch with these header fields belongs to one of the aborted transactions."""
        if not attributes & lib.LS_ATTR_TRANSACTIONAL or attributes & lib.LS_ATTR_CONTROL:
            return False
        return any(first <= base_offset <= last for first, last in self._by_producer.get(producer_id, ()))


def parse_txn_entries(data: bytes, base_offset: int) -> tuple[list[AbortedTxn], str | None]:
    """The entries of a ``.txnindex`` file's bytes (see :class:`TransactionIndex`), up to the
    first invalid one, and why the rest cannot be trusted (None when all are valid). Pure."""
    entry = TransactionIndex.ENTRY
    size = entry.size
    damage = f"file size {len(data)} is not a multiple of {size} bytes" if len(data) % size else None
    entries: list[AbortedTxn] = []
    last = -1
    for n, (version, pid, first, last_offset, lso) in enumerate(entry.iter_unpack(data[:len(data) - len(data) % size])):
        if (version != TransactionIndex.VERSION or pid < 0 or not 0 <= first <= last_offset or last_offset <= last
                or last_offset < base_offset):
            damage = damage or f"entry {n} is invalid (version {version}, producer {pid}, offsets {first}..{last_offset})"
            break
        entries.append(AbortedTxn(pid, first, last_offset, lso))
        last = last_offset
    return entries, damage


def collect_aborted(entries: list[AbortedTxn], fetch_offset: int, upper_bound: int) -> tuple[list[AbortedTxn], bool]:
    """Of one transaction index's ``entries`` (in marker order), those that overlap
    [fetch_offset, upper_bound), and whether the search is complete (Kafka's collectAbortedTxns:
    see :meth:`TransactionIndex.collect`; a remote segment's index is searched the same way)."""
    found = []
    for txn in entries:
        if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound:
            found.append(txn)
        if txn.last_stable_offset >= upper_bound:
            return found, True
    return found, False


class TransactionIndex:
    """TransactionIndex owns NNN.txnindex: the aborted transactions whose ABORT marker is in the
    segment, in marker order (Kafka's TransactionIndex). Each entry is 34 bytes, big-endian::

        version             int16  0
        producer_id         int64
        first_offset        int64  the transaction's first record (maybe in an earlier segment)
        last_offset         int64  its ABORT marker
        last_stable_offset  int64  the log's LSO once the transaction was aborted

    A read_committed reader learns from it which transactional batches of a range to drop: those
    of an entry's producer between its first and last offset. An entry whose last stable offset
    reaches past the range tells that no later segment can add one for the range.

    The file exists only once it has an entry (most segments never see an abort). Entries are
    few and are kept in memory too; appends are written at once (page cache) and made durable
    by :meth:`flush`, which the segment calls whenever it fsyncs its log. The index is derived
    data: recovery rebuilds the indexes of the segments it scans from the log's markers.

    Thread-safety: not thread-safe; the owning LogSegment's Log serialises access.
    """

    ENTRY = struct.Struct(">hqqqq")
    VERSION = 0

    def __init__(self, path: str, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._fd = -1
        self._dirty = False
        self.entries: list[AbortedTxn] = []
        #: why the file cannot be trusted (a cut entry, a bad version, entries out of order), or None
        self.damage: str | None = None
        self._read()

    def _read(self) -> None:
        """(Re)load the entries from the file (none when it does not exist)."""
        self.entries = []
        self.damage = None
        try:
            data = _fileio.ops.read_file(self.path)
        except FileNotFoundError:
            return
        self.entries, self.damage = parse_txn_entries(data, self.base_offset)

    def __len__(self) -> int:
        return len(self.entries)

    def refresh(self) -> None:
        """Take up entries another process appended (a shared log's active segment): the file
        is read again when its size is not that of the entries known."""
        try:
            size = _fileio.ops.size(self.path)
        except FileNotFoundError:
            size = 0
        if size != len(self.entries) * self.ENTRY.size:
            self._read()

    @property
    def exists(self) -> bool:
        """Whether the file exists (it is made by the first entry)."""
        return self._fd >= 0 or _fileio.ops.exists(self.path)

    def _open(self) -> int:
        if self._fd < 0:
            self._fd = _fileio.ops.open(self.path, os.O_RDWR | os.O_CREAT)
        return self._fd

    def append(self, txn: AbortedTxn) -> None:
        """Add an entry (its marker must lie after the last entry's). Written to the page cache
        now, durable after :meth:`flush`.

        Raises:
            ValueError: the marker does not follow the last entry's.
        """
        if self.entries and txn.last_offset <= self.entries[-1].last_offset:
            raise ValueError(f"{self.path}: aborted transaction ending at {txn.last_offset} does not follow "
                             f"the last one, ending at {self.entries[-1].last_offset}")
        fd = self._open()
        _fileio.ops.pwrite(fd, self.ENTRY.pack(self.VERSION, *txn), len(self.entries) * self.ENTRY.size)
        self.entries.append(txn)
        self._dirty = True

    def collect(self, fetch_offset: int, upper_bound: int) -> tuple[list[AbortedTxn], bool]:
        """The entries that overlap [fetch_offset, upper_bound) (marker at or after
        ``fetch_offset``, first record before ``upper_bound``), and whether the search is
        complete: an entry's last stable offset reaches ``upper_bound``, so later segments hold
        none for the range (Kafka's collectAbortedTxns)."""
        return collect_aborted(self.entries, fetch_offset, upper_bound)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or after ``offset`` (the log was cut there)."""
        keep = sum(1 for txn in self.entries if txn.last_offset < offset)
        if keep == len(self.entries):
            return
        del self.entries[keep:]
        if self.exists:
            _fileio.ops.ftruncate(self._open(), keep * self.ENTRY.size)
            self._dirty = True

    def reset(self) -> None:
        """Drop every entry and the file (before a rebuild)."""
        self.entries.clear()
        self.damage = None
        self.close()
        try:
            _fileio.ops.unlink(self.path)
        except FileNotFoundError:
            pass

    def sanity_check(self) -> None:
        """Raise CorruptIndexError when the file could not be read whole and in order."""
        if self.damage:
            raise CorruptIndexError(self.path, self.damage)

    def flush(self) -> None:
        """fsync the file if anything was written since the last flush."""
        if self._dirty and self._fd >= 0:
            _fileio.ops.fsync(self._fd)
        self._dirty = False

    def close(self) -> None:
        """Close the file (its entries stay readable in memory)."""
        if self._fd >= 0:
            _fileio.ops.close(self._fd)
            self._fd = -1
        self._dirty = False

    def rename_to(self, path: str) -> None:
        """Rename the file (if it exists) and remember the new path."""
        if self.exists:
            _fileio.ops.rename(self.path, path)
        self.path = path

    def __repr__(self) -> str:
        return f"TransactionIndex({self.path!r}, entries={len(self.entries)})"
