"""The unit suites check what each module says and does, never what survives a power loss (the
crash suites' job): fsync is a no-op here (``no_flush_to_disk``, tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_flush(no_flush_to_disk):
    yield


def _pmd_mapped_bytes(address: int) -> int:
    """The bytes of this process's mapping that contains ``address`` which the kernel maps with
    huge (PMD) entries of file pages: /proc/self/smaps' FilePmdMapped (0 where not reported)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start <= address < end
            elif inside and head == "FilePmdMapped:":
                return int(line.split()[1]) * 1024
    return 0


@pytest.fixture
def pmd_mapped(tmp_path):
    """``pmd_mapped(mm)``: the bytes of the read-only map ``mm`` mapped by huge page entries
    after every page of it was read. Skips the test where the kernel and file system under
    tmp_path make no huge page-cache folios (probed with a file written in one 8 MiB write,
    which Linux 6.16+ on ext4 or xfs caches in 2 MiB folios)."""
    import mmap

    from logstore._native import ffi

    def measure(mm) -> int:
        view = memoryview(mm)
        try:
            for at in range(0, len(mm), mmap.PAGESIZE):
                view[at]  # read fault: the kernel maps a whole huge folio at once where it can
        finally:
            view.release()
        buf = ffi.from_buffer(mm)
        try:
            return _pmd_mapped_bytes(int(ffi.cast("uintptr_t", buf)))
        finally:
            ffi.release(buf)

    probe = tmp_path / "large-folio-probe"
    probe.write_bytes(b"p" * (8 << 20))
    with open(probe, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            supported = measure(mm) > 0
        finally:
            mm.close()
    probe.unlink()
    if not supported:
        pytest.skip("no huge page-cache folios on this kernel and file system")
    return measure
