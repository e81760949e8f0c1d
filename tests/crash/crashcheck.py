"""Shared model and checks of the crash tests: what was written, and what must survive.

Every value encodes the offset it was written at and a tag naming the writer (the cycle, the
process), so that a record resurrected from an earlier life of the log, a record at the wrong
offset, or a mix of two writers is told apart from the one the history expects.

The invariant checked after every crash ("the log is a prefix of history"):

* the log starts at the expected log start offset and its offsets are contiguous up to the log
  end, with no gap and no duplicate;
* every record holds exactly the value (and key) that history says was appended at its offset;
* the log end is at least the durable frontier (everything acknowledged as durable survived)
  and at most the end of history (nothing was invented).
"""

from __future__ import annotations

import faulthandler
import os
import random
import sys
import traceback
from typing import Any, Sequence

from logstore import Log, _fileio
from logstore._fileio import FileOps

from powerloss import PowerLoss, PowerLossFileOps

__all__ = ["value_for", "key_for", "check_log", "append_some", "describe", "CONFIG", "Writer"]

#: A small-segment configuration: 16 KiB segments roll every ~200 records; small indexes with
#: an entry every 1 KiB so that reads go through real index lookups.
CONFIG = dict(segment_bytes=16 * 1024, segment_index_bytes=4096, index_interval_bytes=1024)


def value_for(offset: int, tag: str) -> bytes:
    """The value written at ``offset`` by writer ``tag``: self-describing, 8..110 bytes."""
    pad = (offset * 7919) % 97
    return b"%d|%s|" % (offset, tag.encode()) + bytes((offset + i) % 251 for i in range(pad))


def key_for(offset: int) -> bytes | None:
    return None if offset % 11 == 0 else b"k%d" % (offset % 17)


def append_some(log: Log, history: list[bytes], tag: str, count: int, rng: random.Random) -> int:
    """Append ``count`` records (single appends and batches) and extend ``history``; return the
    new log end. The log end must equal ``len(history)`` on entry."""
    end = log.log_end_offset
    assert end == len(history), f"log end {end} != history end {len(history)}"
    done = 0
    while done < count:
        k = min(count - done, rng.choice((1, 1, 3, 8)))
        values = [value_for(end + i, tag) for i in range(k)]
        keys = [key_for(end + i) for i in range(k)]
        if k == 1 and rng.random() < 0.5:
            got = log.append(values[0], key=keys[0])
        else:
            got = log.append_batch(values, keys=keys)
        assert got == end, f"append returned offset {got}, expected {end}"
        history.extend(values)
        end += k
        done += k
    return end


def check_log(log: Log, history: Sequence[bytes], start: int | tuple[int, int], durable_end: int,
              rng: random.Random | None = None, what: str = "") -> int:
    """Assert that ``log`` holds exactly ``history[start:end]`` for some end in
    [durable_end, len(history)]; return end. ``start`` may be a range (lo, hi) when a crash
    interrupted a move of the log start. ``what`` prefixes failure messages."""
    prefix = f"{what}: " if what else ""
    lo, hi = start if isinstance(start, tuple) else (start, start)
    assert lo <= log.log_start_offset <= hi, f"{prefix}log start {log.log_start_offset}, expected {start}"
    start = log.log_start_offset
    end = log.log_end_offset
    assert end >= durable_end, (
        f"{prefix}lost durable records: log ends at {end} but offsets below {durable_end} were "
        f"acknowledged as durable")
    assert end <= len(history), f"{prefix}log end {end} is past everything ever appended ({len(history)})"
    records = list(log.iter())
    offsets = [r.offset for r in records]
    if offsets != list(range(start, end)):
        gaps = sorted(set(range(start, end)) - set(offsets))[:10]
        dups = sorted({o for o in offsets if offsets.count(o) > 1})[:10] if len(offsets) < 5000 else "?"
        raise AssertionError(f"{prefix}offsets are not contiguous [{start}, {end}): {len(offsets)} records, "
                             f"missing {gaps}, duplicated {dups}, first {offsets[:5]}, last {offsets[-5:]}")
    for r in records:
        if r.value != history[r.offset] or r.key != key_for(r.offset):
            raise AssertionError(f"{prefix}record at offset {r.offset} holds {r.value[:30]!r} "
                                 f"key {r.key!r}, expected {history[r.offset][:30]!r} key {key_for(r.offset)!r}")
    if rng is not None and end > start:
        # Random access goes through the (recovered or rebuilt) offset indexes.
        for offset in rng.sample(range(start, end), min(5, end - start)):
            got = log.read(offset, max_records=1)
            assert got and got[0].offset == offset and got[0].value == history[offset], (
                f"{prefix}read({offset}) returned {[(r.offset, r.value[:20]) for r in got]}")
    return end


def describe(exc: BaseException, what: str) -> str:
    """One line for a collected failure: where it happened and what was raised."""
    text = str(exc)
    if not text.startswith(what):
        text = f"{what}: {type(exc).__name__}: {text}"
    return text[:400]


class NoSyncFileOps(FileOps):
    """The real file system without the fsync system calls ("eatmydata").

    A SIGKILL cannot lose what is in the page cache, so tests whose processes only die (no power
    loss) skip the slow real syncs; the calls themselves still happen.
    """

    def fsync(self, fd: int) -> None:
        pass

    def fdatasync(self, fd: int) -> None:
        pass

    def fsync_dir(self, path: str) -> None:
        pass


#: Every FileOps operation, in a stable order (fault reports name an operation by its index).
OP_NAMES = sorted(n for n in dir(FileOps) if not n.startswith("_"))


class AtNthCall(NoSyncFileOps):
    """Counts calls into FileOps (nested ones too: read_file -> open) and, when the n-th call
    begins, returns ``self.at_nth(name, operation, args, kwargs)`` instead: subclasses define
    ``at_nth`` to inject their fault (raise an error, kill the process)."""

    def __init__(self, n: int, wfd: int) -> None:
        self.n = n
        self.wfd = wfd
        self.calls = 0

    def __getattribute__(self, name: str) -> Any:
        attr = object.__getattribute__(self, name)
        if name.startswith("_") or name not in OP_NAMES:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.n:
                return self.at_nth(name, attr, args, kwargs)
            return attr(*args, **kwargs)

        return counted


def fork_child(target: Any, *args: Any, quiet_faults: bool = False) -> tuple[int, int]:
    """Fork a child running ``target(*args, wfd)``; return (pid, read end of its pipe).

    The child never returns into pytest: it exits 0, or 3 after printing an exception. With
    ``quiet_faults`` a segfault in the child is reported by the parent alone (no faulthandler).
    """
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            if quiet_faults:
                faulthandler.disable()
            os.close(rfd)
            target(*args, wfd)
        except BaseException:
            traceback.print_exc(file=sys.stderr)
            sys.stderr.flush()
            code = 3
        finally:
            os._exit(code)
    os.close(wfd)
    return pid, rfd


#: A compacted log small enough to sweep every file operation of one cleaner pass over it.
COMPACTED = dict(cleanup_policy="compact", segment_bytes=600, index_interval_bytes=64)


def compacted_template(root: Any) -> tuple[Any, list[tuple[int, bytes, bytes | None]]]:
    """``root/template/t-0``: 120 records over 12 keys (a tenth tombstones), rolled so that the
    cleaner has sealed segments to work on; returns (template dir, [(offset, key, value)])."""
    path = root / "template"
    history = []
    with Log.open(str(path / "t-0"), **COMPACTED) as log:
        rng = random.Random(11)
        for i in range(120):
            key = b"k%d" % rng.randrange(12)
            value = None if rng.random() < 0.1 else b"v%d" % i
            history.append((log.append(value, key=key), key, value))
        log.roll()
    return path, history


def check_compacted(path: str, history: list[tuple[int, bytes, bytes | None]], what: str) -> None:
    """After a cleaner pass was cut short: offsets increase, nothing appears that was never
    written, and every key still reads its latest value."""
    latest = {key: (offset, value) for offset, key, value in history}
    with Log.open(path, **COMPACTED) as log:
        got = [(r.offset, r.key, r.value) for r in log.iter()]
    offsets = [o for o, _, _ in got]
    assert offsets == sorted(set(offsets)), f"{what}: offsets repeat or go back"
    assert set(got) <= set(history), f"{what}: records that were never written"
    assert {k: (o, v) for o, k, v in got} == latest, f"{what}: a key lost its latest value"


def build_transactional_compacted(path: str) -> list[tuple[int, bytes, bytes]]:
    """A compacted log whose next pass carries index entries into a cleaned segment: committed
    records over 5 keys, then producer 1's transaction left open (the pass stops at it) and
    producer 2's transaction on key k0 aborted past that end (its records copied as they are,
    hidden by the cleaned segment's ``.txnindex``), all in one sealed segment. Returns the
    committed [(offset, key, value)]."""
    history = []
    with Log.open(path, **TXN_COMPACTED) as log:
        for i in range(40):
            key, value = b"k%d" % (i % 5), b"v%d" % i
            history.append((log.append(value, key=key), key, value))
        log.append_batch([b"open"], [b"o"], producer_id=1, producer_epoch=0, base_sequence=0, transactional=True)
        log.append_batch([b"aborted"], [b"k0"], producer_id=2, producer_epoch=0, base_sequence=0, transactional=True)
        log.append_txn_marker(2, 0, commit=False)
        log.roll()
    return history


def check_transactional_compacted(path: str, history: list[tuple[int, bytes, bytes]], what: str) -> None:
    """After a pass of :func:`build_transactional_compacted` was cut short: read_committed
    shows no aborted record and every key's latest committed value, before and after producer
    1 commits and a next pass runs (which must not take the aborted record for k0's latest)."""
    latest = {key: (offset, value) for offset, key, value in history}

    def committed(log: Log) -> list[tuple[int, bytes, bytes]]:
        return [(r.offset, r.key, r.value) for r in log.read(0, max_bytes=1 << 20, isolation_level="read_committed")]

    with Log.open(path, **TXN_COMPACTED) as log:
        got = committed(log)
        assert set(got) <= set(history), f"{what}: read_committed shows records not committed: {set(got) - set(history)}"
        assert {k: (o, v) for o, k, v in got} == latest, f"{what}: a key lost its latest committed value"
        log.append_txn_marker(1, 0, commit=True)
        log.roll()
        log.compact()
    with Log.open(path, **TXN_COMPACTED) as log:
        got = committed(log)
        expected = {**latest, b"o": (40, b"open")}
        assert b"aborted" not in {v for _, _, v in got}, f"{what}: an aborted record became visible"
        assert {k: (o, v) for o, k, v in got} == expected, f"{what}: the next pass lost committed data"
        assert b"k0" in {k for _, k, _ in got}


TXN_COMPACTED = dict(cleanup_policy="compact", segment_bytes=100_000, index_interval_bytes=64)


# ---------------------------------------------------------------------------- the writer model
class Writer:
    """Drives a Log and keeps the model of what it wrote and what is acknowledged as durable.

    Values enter ``history`` before the call that writes them, so a call cut short by a power
    loss leaves its values in history as "maybe". ``durable`` only moves when a call returns.
    """

    def __init__(self, path: str, config: dict, rng: random.Random, flush_every: int | None = None,
                 retention: bool = False) -> None:
        self.path = path
        self.retention = retention
        self.config = config
        self.rng = rng
        self.flush_every = flush_every
        self.history: list[bytes] = []
        self.start = self.start_hi = 0
        self.durable = 0
        self.log: Log | None = None
        self.tag = "w0"
        self._since_flush = 0

    def _acknowledge(self, end: int) -> None:
        self.durable = max(self.durable, end, self.log.recovery_point)  # type: ignore[union-attr]

    def open(self) -> None:
        self.log = None
        self.log = Log.open(self.path, **self.config)
        assert self.log.log_end_offset == len(self.history), "open lost or invented records"
        self._acknowledge(self.log.log_end_offset)  # an open that returned has made its log durable

    def close(self) -> None:
        log = self.log
        log.close()  # type: ignore[union-attr]
        self.durable = len(self.history)
        self.log = None

    def abandon(self) -> None:
        """The process dies (no power loss): the page cache keeps everything."""
        self.log._abandon()  # type: ignore[union-attr]
        self.log = None

    def step(self) -> None:
        log = self.log
        assert log is not None
        end = log.log_end_offset
        assert end == len(self.history)
        r = self.rng.random()
        if r < 0.85:
            k = 1 if r < 0.45 else self.rng.randint(2, 12)
            values = [value_for(end + i, self.tag) for i in range(k)]
            keys = [key_for(end + i) for i in range(k)]
            self.history.extend(values)
            if k == 1:
                got = log.append(values[0], key=keys[0])
            else:
                got = log.append_batch(values, keys=keys)
            assert got == end, f"append returned {got}, expected {end}"
            self._since_flush += k
            if self.config.get("flush_messages") == 1:
                self._acknowledge(end + k)
            elif self.flush_every and self._since_flush >= self.flush_every:
                log.flush()
                self._since_flush = 0
                self._acknowledge(end + k)
            else:
                self._acknowledge(0)
        elif r < 0.95:
            log.roll()  # "once its segment rolls" it is durable
            self._acknowledge(end)
        elif self.retention and self.rng.random() < 0.5:
            # Size/time retention: deletes whole sealed segments, moving the start to a base.
            self.start_hi = end
            log.enforce_retention()
            self.start = self.start_hi = log.log_start_offset
            self._acknowledge(0)
        elif end > self.start:
            target = self.rng.randint(self.start, end)
            self.start_hi = max(self.start_hi, target)
            self.start = self.start_hi = log.delete_records_before(target)
            assert self.start == target
            self._acknowledge(0)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def drop(self) -> None:
        """Forget the Log object the way a dead machine does (no flush, no close)."""
        if self.log is not None:
            self.log._abandon()
            self.log = None

    def verify_after_power_loss(self, ops: PowerLossFileOps, mode: str, rng: random.Random, what: str,
                                crash_during_recovery: int | None = None) -> None:
        """Cut the power, reboot the tree, reopen with the plain FileOps and check the model;
        then append a few records and leave the log (closed or abandoned) for the next life."""
        self.drop()
        ops.crash(mode, rng)
        if crash_during_recovery is not None:
            # Power goes again while the recovery of that crash runs (under the simulator).
            ops.schedule(crash_during_recovery)
            try:
                self.log = Log.open(self.path, **self.config)
                ops.cut()
            except PowerLoss:
                pass
            self.drop()
            ops.crash(mode, rng)
        self.check_after_reboot(rng, what)
        ops.resync()  # the page cache as the verification left it is the disk now

    def check_after_reboot(self, rng: random.Random, what: str) -> None:
        """Reopen with the plain FileOps, check the model, append 3 records, close or abandon."""
        with _fileio.install(FileOps()):
            log = Log.open(self.path, **self.config)
            try:
                end = check_log(log, self.history, (self.start, self.start_hi), self.durable, rng, what)
                del self.history[end:]
                self.start = self.start_hi = log.log_start_offset
                self.tag = f"w{int(self.tag[1:]) + 1}"
                for _ in range(3):  # the recovered log takes appends at the right offsets
                    offset = log.log_end_offset
                    self.history.append(value_for(offset, self.tag))
                    assert log.append(self.history[-1], key=key_for(offset)) == offset
                assert [r.value for r in log.iter(end)] == self.history[end:]
            finally:
                log.close() if rng.random() < 0.5 else log._abandon()
        self.durable = len(self.history)  # once the caller resyncs the simulator
