"""What every suite shares.

Forked children (the crash suites' writers, the lock and view tests' second processes) must not
run the garbage collector over what they inherited: an object of an earlier test that is
garbage in a cycle (kept by a failed test's traceback, say) would be finalised in the child,
and a finaliser that owns the parent's threads or handles (a confluent-kafka client joins
librdkafka's threads, which do not exist in the child) crashes it. So the objects alive at a
fork are frozen for the child (``gc.freeze``: never collected there) and unfrozen again in the
parent.

``no_flush_to_disk``: suites that check what the library *says* (offsets, records, fates), never
what survives a power loss, make fsync a no-op (as eatmydata does): the same calls are made in
the same order through ``_fileio``, without waiting for the disk's flush. What survives a power
loss is the crash suites' job (tests/crash/, whose simulated file system decides what an fsync
kept, and SIGKILL, after which the page cache keeps everything anyway).
"""

from __future__ import annotations

import gc
import os

import pytest

os.register_at_fork(before=gc.freeze, after_in_parent=gc.unfreeze)


def _no_sync(fd: int) -> None:
    """os.fsync / os.fdatasync without the flush to stable storage (the page cache keeps every
    write; a bad descriptor still raises)."""
    os.fstat(fd if isinstance(fd, int) else fd.fileno())


@pytest.fixture
def no_flush_to_disk(monkeypatch):
    """os.fsync and os.fdatasync do nothing in this test (in this process): ``_fileio`` makes the
    same calls in the same order, and a test that patches ``_fileio``'s operations still sees them."""
    monkeypatch.setattr(os, "fsync", _no_sync)
    monkeypatch.setattr(os, "fdatasync", _no_sync)
    yield
