"""Unit tests of logstore.index: OffsetIndex and TimeIndex over their memory-mapped files."""

from __future__ import annotations

import os
import pathlib
import struct
from typing import Iterator

import pytest

from logstore._native import ffi
from logstore.errors import CorruptIndexError
from logstore.index import OffsetIndex, TimeIndex

BASE = 100


def offset_entries(*entries: tuple[int, int]) -> bytes:
    """(relative offset, position) pairs as an .index file."""
    return b"".join(struct.pack(">ii", rel, pos) for rel, pos in entries)


def time_entries(*entries: tuple[int, int]) -> bytes:
    """(timestamp, relative offset) pairs as a .timeindex file."""
    return b"".join(struct.pack(">qi", ts, rel) for ts, rel in entries)


@pytest.fixture
def opened() -> Iterator[list]:
    """Closes every index a test opened."""
    indexes: list = []
    yield indexes
    for ix in indexes:
        ix.close()


@pytest.fixture
def make_offset_index(tmp_path: pathlib.Path, opened: list):
    def make(data: bytes | None = b"", writable: bool = False, max_size: int = 4096, name: str = "x.index") -> OffsetIndex:
        path = tmp_path / name
        if data is not None:
            path.write_bytes(data)
        ix = OffsetIndex(str(path), BASE, max_size, writable=writable)
        opened.append(ix)
        return ix
    return make


@pytest.fixture
def make_time_index(tmp_path: pathlib.Path, opened: list):
    def make(data: bytes | None = b"", writable: bool = False, max_size: int = 4096, name: str = "x.timeindex") -> TimeIndex:
        path = tmp_path / name
        if data is not None:
            path.write_bytes(data)
        ix = TimeIndex(str(path), BASE, max_size, writable=writable)
        opened.append(ix)
        return ix
    return make


def put(ix: OffsetIndex | TimeIndex, raw: bytes) -> None:
    """Append raw entries through the map, as the C appender does."""
    ffi.memmove(ix.pointer + ix.entries * ix.entry_size, raw, len(raw))
    ix.entries += len(raw) // ix.entry_size


# ---------------------------------------------------------------------- empty indexes
def test_missing_offset_index_is_created_empty(make_offset_index, tmp_path: pathlib.Path) -> None:
    ix = make_offset_index(data=None)
    assert (tmp_path / "x.index").exists()
    assert ix.entries == 0 and ix.size_bytes == 0
    assert ix.lookup(BASE + 50) == (BASE, 0)
    assert ix.last_entry() == (BASE, 0)
    ix.sanity_check()


def test_empty_time_index_lookup_starts_at_segment_base(make_time_index) -> None:
    ti = make_time_index()
    assert ti.lookup(10**12) == (-1, BASE)
    assert ti.last_entry() == (-1, BASE)
    ti.sanity_check()


# ---------------------------------------------------------------------- OffsetIndex lookup
@pytest.fixture
def three(make_offset_index) -> OffsetIndex:
    # entries at absolute offsets 102, 105, 109
    return make_offset_index(offset_entries((2, 200), (5, 500), (9, 900)))


def test_offset_lookup_before_first_entry_returns_base_and_zero(three: OffsetIndex) -> None:
    assert three.lookup(BASE) == (BASE, 0)
    assert three.lookup(BASE + 1) == (BASE, 0)


def test_offset_lookup_below_base_returns_base_and_zero(three: OffsetIndex) -> None:
    assert three.lookup(0) == (BASE, 0)
    assert three.lookup(-1) == (BASE, 0)


@pytest.mark.parametrize("target, expected", [
    (102, (102, 200)),  # exact
    (104, (102, 200)),  # floor
    (105, (105, 500)),
    (108, (105, 500)),
    (109, (109, 900)),
    (110, (109, 900)),
    (BASE + 2**31 + 5, (109, 900)),  # beyond the int32 relative range: still the last entry
])
def test_offset_lookup_returns_largest_entry_at_or_below_target(three: OffsetIndex, target: int, expected: tuple) -> None:
    assert three.lookup(target) == expected


def test_offset_entry_and_last_entry_are_absolute(three: OffsetIndex) -> None:
    assert [three.entry(i) for i in range(3)] == [(102, 200), (105, 500), (109, 900)]
    assert three.last_entry() == (109, 900)
    assert three.entries == 3 and three.size_bytes == 24


# ---------------------------------------------------------------------- TimeIndex lookup
@pytest.fixture
def times(make_time_index) -> TimeIndex:
    return make_time_index(time_entries((1000, 2), (2000, 5), (3000, 9)))


@pytest.mark.parametrize("target, expected", [
    (999, (-1, BASE)),       # before every entry: scan from the segment start
    (-1, (-1, BASE)),
    (1000, (1000, 102)),     # exact
    (1999, (1000, 102)),     # largest timestamp <= target
    (2000, (2000, 105)),
    (2999, (2000, 105)),
    (3000, (3000, 109)),
    (2**62, (3000, 109)),
])
def test_time_lookup_returns_largest_timestamp_at_or_below_target(times: TimeIndex, target: int, expected: tuple) -> None:
    assert times.lookup(target) == expected


def test_time_entry_and_last_entry_are_absolute(times: TimeIndex) -> None:
    assert times.entry(1) == (2000, 105)
    assert times.last_entry() == (3000, 109)
    assert times.size_bytes == 36


def test_time_lookup_handles_negative_timestamps(make_time_index) -> None:
    ti = make_time_index(time_entries((-50, 1), (-10, 4)))
    assert ti.lookup(-51) == (-1, BASE)
    assert ti.lookup(-30) == (-50, 101)
    assert ti.lookup(0) == (-10, 104)


# ---------------------------------------------------------------------- truncate_to
@pytest.mark.parametrize("offset, kept", [
    (109, [(102, 200), (105, 500)]),   # an entry equal to the offset goes too
    (106, [(102, 200), (105, 500)]),
    (105, [(102, 200)]),
    (103, [(102, 200)]),
    (102, []),
    (BASE, []),
    (0, []),                           # below the base: everything goes
    (110, [(102, 200), (105, 500), (109, 900)]),
])
def test_offset_truncate_to_removes_entries_at_or_after_offset(three: OffsetIndex, offset: int, kept: list) -> None:
    three.truncate_to(offset)
    assert [three.entry(i) for i in range(three.entries)] == kept
    # A read-only index is trimmed on disk as well.
    assert os.path.getsize(three.path) == 8 * len(kept)


@pytest.mark.parametrize("offset, kept", [
    (109, [(1000, 102), (2000, 105)]),
    (105, [(1000, 102)]),
    (104, [(1000, 102)]),
    (102, []),
    (0, []),
    (110, [(1000, 102), (2000, 105), (3000, 109)]),
])
def test_time_truncate_to_removes_entries_at_or_after_offset(times: TimeIndex, offset: int, kept: list) -> None:
    times.truncate_to(offset)
    assert [times.entry(i) for i in range(times.entries)] == kept
    assert os.path.getsize(times.path) == 12 * len(kept)


def test_writable_truncate_zeroes_removed_slots_so_reopen_finds_the_same_count(make_offset_index, tmp_path) -> None:
    ix = make_offset_index(offset_entries((2, 200), (5, 500), (9, 900)), writable=True)
    assert ix.entries == 3 and ix.writable
    ix.truncate_to(105)
    assert ix.entries == 1
    assert os.path.getsize(ix.path) == 4096  # still preallocated
    ix.close()  # no trim: as after a crash
    again = make_offset_index(data=None, writable=True)
    assert again.entries == 1
    assert again.last_entry() == (102, 200)


def test_writable_time_truncate_zeroes_removed_slots(make_time_index) -> None:
    ti = make_time_index(time_entries((1000, 2), (2000, 5), (3000, 9)), writable=True)
    ti.truncate_to(105)
    assert ti.entries == 1
    ti.close()
    assert make_time_index(data=None, writable=True).entries == 1


def test_truncate_of_empty_index_is_a_no_op(make_offset_index, make_time_index) -> None:
    ix, ti = make_offset_index(), make_time_index()
    ix.truncate_to(BASE)
    ti.truncate_to(BASE)
    assert ix.entries == ti.entries == 0


# ---------------------------------------------------------------------- make_writable / trim
def test_make_writable_preallocates_to_whole_entries_and_keeps_entries(make_offset_index, make_time_index) -> None:
    ix = make_offset_index(offset_entries((2, 200), (5, 500)), max_size=1000)
    ix.make_writable()
    assert ix.writable and ix.entries == 2
    assert os.path.getsize(ix.path) == 1000 and ix.capacity == 125
    ti = make_time_index(time_entries((1000, 2)), max_size=1000)
    ti.make_writable()
    assert os.path.getsize(ti.path) == 996 and ti.capacity == 83 and ti.entries == 1


def test_make_writable_keeps_a_file_larger_than_max_index_size(make_offset_index) -> None:
    data = offset_entries(*[(i, i * 10) for i in range(1, 21)])  # 160 bytes
    ix = make_offset_index(data, max_size=64)
    ix.make_writable()
    assert ix.entries == 20 and ix.capacity == 20 and ix.is_full


def test_make_writable_with_tiny_max_size_still_holds_one_entry(make_offset_index) -> None:
    ix = make_offset_index(max_size=3)
    ix.make_writable()
    assert ix.capacity == 1 and not ix.is_full


def test_trim_shrinks_to_entries_and_maps_read_only(make_offset_index) -> None:
    ix = make_offset_index(writable=True)
    put(ix, offset_entries((3, 300), (7, 700)))
    ix.trim()
    assert not ix.writable
    assert os.path.getsize(ix.path) == 16
    assert ix.capacity == 2 and ix.is_full
    assert ix.lookup(BASE + 8) == (107, 700)


def test_untrimmed_active_index_reopens_with_its_entries(make_offset_index, make_time_index) -> None:
    ix = make_offset_index(writable=True)
    put(ix, offset_entries((3, 300), (7, 700), (8, 750)))
    ix.close()  # crash: the file keeps its preallocated zero tail
    again = make_offset_index(data=None, writable=True)
    assert again.entries == 3 and again.last_entry() == (108, 750)

    ti = make_time_index(writable=True)
    put(ti, time_entries((5, 3), (9, 7)))
    ti.close()
    assert make_time_index(data=None, writable=True).entries == 2


def test_read_only_open_of_an_untrimmed_file_counts_the_zero_tail(make_offset_index) -> None:
    # Only make_writable scans for the zero tail; a read-only open counts whole entries, and the
    # zero entries then fail the sanity check, so recovery rebuilds.
    ix = make_offset_index(offset_entries((3, 300)) + bytes(8 * 9))
    assert ix.entries == 10
    with pytest.raises(CorruptIndexError):
        ix.sanity_check()


# ---------------------------------------------------------------------- reset
def test_reset_of_writable_index_leaves_no_stale_entries_after_a_crash(make_offset_index) -> None:
    ix = make_offset_index(offset_entries(*[(i, 100 * i) for i in range(1, 6)]), writable=True)
    assert ix.entries == 5
    ix.reset()
    assert ix.entries == 0 and ix.writable
    put(ix, offset_entries((1, 100), (2, 200)))  # a rebuild writes two entries ...
    ix.close()  # ... and the process dies before trim
    again = make_offset_index(data=None, writable=True)
    assert again.entries == 2  # entries 3..5 of the earlier life must not reappear
    assert again.last_entry() == (102, 200)


def test_reset_of_read_only_index_empties_the_file_and_make_writable_finds_nothing(make_offset_index) -> None:
    ix = make_offset_index(offset_entries((2, 200), (5, 500), (9, 900)))
    ix.reset()
    assert ix.entries == 0 and not ix.writable
    assert os.path.getsize(ix.path) == 0
    assert ix.lookup(BASE + 9) == (BASE, 0)
    ix.make_writable()
    assert ix.entries == 0
    assert os.path.getsize(ix.path) == 4096


def test_reset_of_time_index_leaves_no_stale_entries(make_time_index) -> None:
    ti = make_time_index(time_entries((10, 1), (20, 2), (30, 3)), writable=True)
    ti.reset()
    put(ti, time_entries((10, 1)))
    ti.close()
    assert make_time_index(data=None, writable=True).entries == 1


def test_reset_clears_the_partial_entry_flag(make_offset_index) -> None:
    ix = make_offset_index(offset_entries((2, 200)) + b"\x01\x02\x03")
    ix.reset()
    assert os.path.getsize(ix.path) == 0
    ix.sanity_check()


# ---------------------------------------------------------------------- sanity_check
def test_sanity_check_passes_for_well_formed_indexes(three: OffsetIndex, times: TimeIndex) -> None:
    three.sanity_check()
    times.sanity_check()


@pytest.mark.parametrize("entries, bad_slot", [
    (((2, 200), (9, 900), (5, 500)), 2),   # offsets go back
    (((2, 200), (2, 300)), 1),             # offsets repeat
    (((2, 200), (5, 100)), 1),             # positions go back
    (((2, -1),), 0),                       # negative position
    (((-1, 0),), 0),                       # negative relative offset
])
def test_sanity_check_rejects_non_monotonic_offset_index(make_offset_index, entries: tuple, bad_slot: int) -> None:
    ix = make_offset_index(offset_entries(*entries))
    with pytest.raises(CorruptIndexError, match=rf"entry {bad_slot} is out of order or out of range") as info:
        ix.sanity_check()
    assert info.value.path == ix.path


def test_sanity_check_rejects_equal_positions_in_offset_index(make_offset_index) -> None:
    # Each entry marks a different batch, so positions strictly increase.
    with pytest.raises(CorruptIndexError, match=r"entry 1 "):
        make_offset_index(offset_entries((2, 200), (5, 200))).sanity_check()


@pytest.mark.parametrize("entries, bad_slot", [
    (((2000, 2), (1000, 5)), 1),   # timestamps go back
    (((1000, 5), (2000, 2)), 1),   # offsets go back
    (((1000, -3),), 0),
])
def test_sanity_check_rejects_non_monotonic_time_index(make_time_index, entries: tuple, bad_slot: int) -> None:
    ti = make_time_index(time_entries(*entries))
    with pytest.raises(CorruptIndexError, match=rf"entry {bad_slot} "):
        ti.sanity_check()


def test_sanity_check_allows_equal_offsets_but_not_equal_timestamps_in_time_index(make_time_index) -> None:
    make_time_index(time_entries((1000, 2), (1200, 2), (1500, 2))).sanity_check()
    # Appends add an entry only for a newer timestamp, so an equal one (e.g. a zeroed file) is damage.
    with pytest.raises(CorruptIndexError, match=r"entry 1 "):
        make_time_index(time_entries((1000, 2), (1000, 2))).sanity_check()


def test_sanity_check_rejects_relative_offsets_beyond_the_limit(three: OffsetIndex, times: TimeIndex) -> None:
    three.sanity_check(max_relative_offset=9)
    with pytest.raises(CorruptIndexError, match="entry 2"):
        three.sanity_check(max_relative_offset=8)
    with pytest.raises(CorruptIndexError, match="entry 2"):
        times.sanity_check(max_relative_offset=8)


@pytest.mark.parametrize("extra", [1, 4, 7])
def test_partial_offset_index_file_fails_sanity_check(make_offset_index, extra: int) -> None:
    ix = make_offset_index(offset_entries((2, 200), (5, 500)) + b"\x00" * extra)
    assert ix.partial_entry
    assert ix.entries == 2  # only whole entries are counted
    assert ix.lookup(BASE + 6) == (105, 500)
    with pytest.raises(CorruptIndexError, match="not a multiple of 8 bytes"):
        ix.sanity_check()


def test_partial_time_index_file_fails_sanity_check(make_time_index) -> None:
    ti = make_time_index(time_entries((1000, 2)) + b"\x07" * 11)
    assert ti.entries == 1
    with pytest.raises(CorruptIndexError, match="not a multiple of 12 bytes"):
        ti.sanity_check()


def test_make_writable_cuts_a_partial_entry(make_offset_index) -> None:
    ix = make_offset_index(offset_entries((2, 200)) + b"\x09" * 5, max_size=4)
    ix.make_writable()
    assert not ix.partial_entry
    assert os.path.getsize(ix.path) == 8
    assert ix.entries == 1
    ix.sanity_check()


# ---------------------------------------------------------------------- files
def test_rename_to_moves_the_file_and_keeps_working(make_offset_index, tmp_path: pathlib.Path) -> None:
    ix = make_offset_index(offset_entries((2, 200)))
    new = str(tmp_path / "x.index.deleted")
    ix.rename_to(new)
    assert ix.path == new and os.path.exists(new) and not (tmp_path / "x.index").exists()
    assert ix.lookup(BASE + 3) == (102, 200)


def test_close_keeps_the_file_as_it_is(make_offset_index) -> None:
    data = offset_entries((2, 200), (5, 500))
    ix = make_offset_index(data)
    ix.close()
    ix.close()  # idempotent
    assert pathlib.Path(ix.path).read_bytes() == data


@pytest.mark.regression(reason=("fixed: a reader in another process mapped an active (preallocated) index "
    "and scanned it for its zero tail; when the owner trimmed the index at a roll meanwhile, the map "
    "failed ('mmap length is greater than file size', seen under load in the Spark source's read of a "
    "store being written) or, trimmed after the map, the scan touched a page past the end: SIGBUS. "
    "Readers now copy the index's written part"))
def test_a_reader_survives_the_owner_trimming_the_index_under_it(tmp_path: pathlib.Path) -> None:
    import signal

    from logstore import _fileio
    from logstore._fileio import FileOps

    path = str(tmp_path / "00000000000000000000.index")
    owner = OffsetIndex(path, 0, 1 << 20, True)  # preallocated: 1 MiB, mostly a hole
    for i in range(512):  # exactly one page of entries: the zero tail starts on the next page
        struct.pack_into(">ii", owner._mm, i * 8, i + 1, (i + 1) * 100)
    owner.entries = 512

    class TrimAfterSize(FileOps):
        def fsize(self, fd):
            size = super().fsize(fd)
            os.truncate(path, 512 * 8)  # the owner's roll lands between the reader's steps
            return size

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            with _fileio.install(TrimAfterSize()):
                reader = OffsetIndex.open_readonly(path, 0)
            code = 0 if reader.entries == 512 and reader.lookup(300) == (300, 30000) else 2
            reader.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    owner.close()
    assert not os.WIFSIGNALED(status), f"the reader died of {signal.Signals(os.WTERMSIG(status)).name}"
    assert os.WEXITSTATUS(status) == 0


# ---------------------------------------------------------------------- page cache of a writable index
def _resident_pages(path: pathlib.Path) -> int:
    """Pages of ``path`` in the page cache (mincore over a map of the whole file)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    size = path.stat().st_size
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), size) as mm:
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        start = ctypes.c_char.from_buffer(mm)  # an export of the map: dropped before it closes
        try:
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del start
        return sum(v & 1 for v in vec)


def test_a_store_into_a_writable_index_faults_in_one_page_not_a_readahead_window(make_offset_index, make_time_index,
                                                                                   tmp_path: pathlib.Path) -> None:
    """A writable index is a preallocated sparse file (10 MiB by Kafka's default): a fault on its
    next page must not read around it (up to read_ahead_kb, 8 MiB on the project's VM: 8 MiB
    zero-filled on the append that stored a segment's first entry, a stall of 16-140 ms for
    every producer of the partition). Measured, not mocked: the page cache holds only the
    pages stored into."""
    size = 10 << 20
    for ix, raw in ((make_offset_index(None, writable=True, max_size=size), offset_entries((1, 4096))),
                    (make_time_index(None, writable=True, max_size=size), time_entries((1_700_000_000_000, 1)))):
        put(ix, raw)
        ix.reserve(1)
        path = pathlib.Path(ix.path)
        assert path.stat().st_size >= size - ix.entry_size
        assert _resident_pages(path) <= 4, path.name
