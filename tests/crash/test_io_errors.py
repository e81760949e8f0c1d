"""I/O errors injected at every file operation (LevelDB's fault-injection Env, error half).

A writer forked from the test process makes the n-th call into FileOps fail with EIO (or ENOSPC
for space-allocating calls), keeps appending after the error like an application that retries,
and exits without closing. The contract checked: an I/O error surfaces as an exception from the
call that hit it (the log may refuse later writes), the process never dies from it (no SIGSEGV
from a stale mapping), every append that returned is present after a reopen, and the log is a
prefix of what was written.
"""

from __future__ import annotations

import errno
import os
import random
import select
import shutil
import signal
import struct
import time
import traceback

import pytest

from logstore import Log, _fileio
from logstore._fileio import FileOps

from crashcheck import CONFIG, OP_NAMES, fork_child, AtNthCall, NoSyncFileOps, append_some, check_log, key_for, value_for
from crashcheck import describe as _describe
from crashcheck import COMPACTED, check_compacted, compacted_template

_MSG = struct.Struct("<cq")
_SPACE_OPS = {"fallocate", "pwrite", "ftruncate", "open", "write_file_atomic"}


_NoSync = NoSyncFileOps


class _FailAtCall(AtNthCall):
    """The n-th call into FileOps raises OSError before doing anything; the others work. With
    ``persistent`` every later call fails too (a disk that died or filled up for good)."""

    persistent = False

    def __getattribute__(self, name):
        get = object.__getattribute__
        if (name.startswith("_") or name not in OP_NAMES or not get(self, "persistent")
                or get(self, "calls") < get(self, "n")):
            return AtNthCall.__getattribute__(self, name)  # counted; the n-th call fails

        def failing(*args, **kwargs):
            self.calls += 1
            inner = getattr(FileOps, name).__get__(self)
            return self.at_nth(name, inner, args, kwargs)

        return failing

    def at_nth(self, name, attr, args, kwargs):
        os.write(self.wfd, _MSG.pack(b"F", OP_NAMES.index(name)))
        if self.calls == self.n:
            site = _call_site(name).encode()
            os.write(self.wfd, _MSG.pack(b"S", len(site)) + site)
        code = errno.ENOSPC if name in _SPACE_OPS else errno.EIO
        if name == "close":
            attr(*args, **kwargs)  # Linux frees the descriptor even when close fails
        raise OSError(code, f"injected {os.strerror(code)} in {name}")


#: "log.py:1234 _write_checkpoints -> fsync_dir": every library line where an injected fault
#: surfaced in this run (printed at the end of the run, see conftest.py).
CALL_SITES: set[str] = set()


def _call_site(op: str) -> str:
    """The innermost library frame (outside _fileio.py) of the failing FileOps call."""
    for frame in reversed(traceback.extract_stack()):
        name = frame.filename.replace(os.sep, "/")
        if "/logstore/" in name and not name.endswith("/_fileio.py"):
            return f"{os.path.basename(name)}:{frame.lineno} {frame.name} -> {op}"
    return f"? -> {op}"


def _fork_quiet(target, *args):
    return fork_child(target, *args, quiet_faults=True)


def _writer(path: str, config: dict, fail_at: int, persistent: bool, wfd: int) -> None:
    """Open, append 30 records through rolls (retrying after errors), report, exit unclosed."""
    rng = random.Random(5)
    ops = _FailAtCall(fail_at, wfd)
    ops.persistent = persistent
    with _fileio.install(ops):
        try:
            log = Log.open(path, **config)
        except Exception:  # noqa: BLE001 - an open that hits an I/O error may fail
            os.write(wfd, _MSG.pack(b"N", ops.calls))
            return
        errors = 0
        appended = 0
        while appended < 30 and errors < 3:
            try:
                end = log.log_end_offset
                k = rng.choice((1, 1, 4))
                values = [value_for(end + i, "s") for i in range(k)]
                keys = [key_for(end + i) for i in range(k)]
                got = log.append(values[0], key=keys[0]) if k == 1 else log.append_batch(values, keys=keys)
            except Exception as exc:  # noqa: BLE001 - any exception is an allowed way to fail
                errors += 1
                os.write(wfd, _MSG.pack(b"E", len(type(exc).__name__)))
                continue
            if got != end:
                raise AssertionError(f"append returned {got}, expected {end}")
            appended += k
            os.write(wfd, _MSG.pack(b"A", end + k - 1))
    os.write(wfd, _MSG.pack(b"N", ops.calls))
    # Exit without close: what survives is what the page cache holds.


def _read_all(rfd: int, pid: int, timeout: float = 20.0) -> list[tuple[bytes, int]]:
    """The child's messages until it exits; a child that hangs is killed and reported."""
    data = bytearray()
    deadline = time.monotonic() + timeout
    while True:
        ready, _, _ = select.select([rfd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            data += _MSG.pack(b"H", 0)
            break
        chunk = os.read(rfd, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(rfd)
    messages = []
    i = 0
    while i + _MSG.size <= len(data):
        kind, value = _MSG.unpack_from(data, i)
        i += _MSG.size
        if kind == b"S":  # the failing call's site, as text
            CALL_SITES.add(bytes(data[i:i + value]).decode())
            i += value
            continue
        messages.append((kind, value))
    return messages


@pytest.mark.regression(reason=("fixed: an I/O error inside Log._roll after the old segment was sealed (seal unmaps it) leaves "
    "Log._appender pointing at the unmapped segment; the next append that fits writes through "
    "the stale pointer and the process dies of SIGSEGV"))
@pytest.mark.parametrize("stride", [pytest.param(5, id="sampled"), pytest.param(1, id="every", marks=pytest.mark.slow)])
@pytest.mark.parametrize("persistent", [False, True], ids=["once", "persistent"])
def test_io_error_at_every_file_operation_is_an_exception_and_loses_no_returned_append(mem_path, persistent, stride):
    """make test: every one of the open's first 60 file operations, then every fifth; make
    soak: every one."""
    config = dict(CONFIG, segment_bytes=1024, flush_messages=1)
    template = mem_path / "template"
    history: list[bytes] = []
    with _fileio.install(_NoSync()):
        log = Log.open(str(template / "t-0"), **config)
        append_some(log, history, "t", 40, random.Random(1))
        log._abandon()
    history.extend(value_for(o, "s") for o in range(40, 400))
    failures: list[str] = []
    n, total = 1, None
    while total is None or n <= total:
        work = mem_path / f"run{n}"
        shutil.copytree(template, work)
        pid, rfd = _fork_quiet(_writer, str(work / "t-0"), config, n, persistent)
        messages = _read_all(rfd, pid)
        _, status = os.waitpid(pid, 0)
        failed_op = next((OP_NAMES[v] for k, v in messages if k == b"F"), "nothing")
        what = f"{'persistent ' if persistent else ''}error from FileOps call {n} ({failed_op})"
        acked = [v for k, v in messages if k == b"A"]
        done = [v for k, v in messages if k == b"N"]
        if done and failed_op == "nothing":
            total = done[0]
        try:
            if any(k == b"H" for k, _ in messages):
                raise AssertionError(f"{what}: the writer hung (killed after 20 s)")
            if os.WIFSIGNALED(status):
                raise AssertionError(f"{what}: the writer died of signal {signal.Signals(os.WTERMSIG(status)).name}")
            if os.WEXITSTATUS(status) != 0:
                raise AssertionError(f"{what}: the writer failed (exit {os.WEXITSTATUS(status)}, see stderr)")
            with _fileio.install(_NoSync()), Log.open(str(work / "t-0"), **config) as log:
                check_log(log, history, 0, max(40, max(acked, default=-1) + 1), random.Random(n), what)
        except Exception as exc:  # collect every failing point, report them together
            failures.append(_describe(exc, what))
        shutil.rmtree(work)
        n += 1 if n < 60 else stride
    assert total is not None and total > 150, f"the workload made only {total} FileOps calls"
    assert not failures, f"{len(failures)} of {total} error points broke the writer or the log:\n" + "\n".join(failures)


def _roll_fails_then_append(path: str, wfd: int) -> None:
    class DiskFull(FileOps):
        full = False

        def fallocate(self, fd: int, size: int) -> None:
            if self.full:
                raise OSError(errno.ENOSPC, "No space left on device")
            super().fallocate(fd, size)

    ops = DiskFull()
    with _fileio.install(ops):
        log = Log.open(path, segment_bytes=1 << 20)
        for i in range(10):
            log.append(b"v%d" % i)
        ops.full = True
        try:
            log.roll()  # the new segment cannot be allocated
        except OSError:
            os.write(wfd, _MSG.pack(b"R", 0))
        ops.full = False
        try:
            log.append(b"after")  # must raise or succeed, not crash the interpreter
        except Exception:  # noqa: BLE001
            pass
        os.write(wfd, _MSG.pack(b"N", 0))


@pytest.mark.regression(reason=("fixed: Log.roll() failing with ENOSPC while creating the new segment leaves the sealed, "
    "unmapped old segment's appender in place; the next append segfaults"))
def test_append_after_a_roll_failed_with_enospc_does_not_crash_the_process(mem_path):
    pid, rfd = _fork_quiet(_roll_fails_then_append, str(mem_path / "t-0"))
    messages = _read_all(rfd, pid)
    _, status = os.waitpid(pid, 0)
    assert (b"R", 0) in messages, "the injected ENOSPC did not reach roll()"
    assert not os.WIFSIGNALED(status), f"the process died of {signal.Signals(os.WTERMSIG(status)).name}"
    assert (b"N", 0) in messages
    with Log.open(str(mem_path / "t-0")) as log:
        assert [r.value for r in log.read(0)][:10] == [b"v%d" % i for i in range(10)]


def test_after_an_fsync_error_the_log_refuses_writes_until_reopened(mem_path):
    """fsync errors are not retried and forgotten: after a failed fdatasync the page cache may
    have dropped the data, so the log goes offline; a reopen recovers what is on disk."""
    from logstore import LogOfflineError

    class FailingSync(FileOps):
        fail = False

        def fdatasync(self, fd):
            if self.fail:
                raise OSError(errno.EIO, "injected EIO in fdatasync")
            super().fdatasync(fd)

    ops = FailingSync()
    path = str(mem_path / "t-0")
    with _fileio.install(ops):
        log = Log.open(path)
        log.append_batch([b"durable %d" % i for i in range(5)])
        log.flush()
        log.append(b"not yet durable")
        ops.fail = True
        with pytest.raises(OSError):
            log.flush()
        ops.fail = False  # the disk "works" again: the log must still refuse
        with pytest.raises(LogOfflineError):
            log.append(b"after the error")
        with pytest.raises(LogOfflineError):
            log.flush()
        log.close()
    with Log.open(path) as log:
        values = [r.value for r in log.iter()]
    assert values[:5] == [b"durable %d" % i for i in range(5)] and b"after the error" not in values
    with Log.open(path) as log:
        log.append(b"writable again")
        log.flush()


def _compact_with_error(path: str, config: dict, fail_at: int, wfd: int) -> None:
    ops = _FailAtCall(fail_at, wfd)
    with _fileio.install(ops):
        try:
            log = Log.open(path, **config)
        except Exception:  # noqa: BLE001
            os.write(wfd, _MSG.pack(b"N", ops.calls))
            return
        try:
            log.compact()
        except Exception:  # noqa: BLE001 - a failed pass is allowed; what it leaves is checked
            os.write(wfd, _MSG.pack(b"E", 0))
    os.write(wfd, _MSG.pack(b"N", ops.calls))


def _compaction_error_sweep(mem_path, stride):
    config = COMPACTED
    template, history = compacted_template(mem_path)
    n, total, errors = 1, None, 0
    while total is None or n <= total:
        work = mem_path / f"c{n}"
        shutil.copytree(template, work)
        pid, rfd = _fork_quiet(_compact_with_error, str(work / "t-0"), config, n)
        messages = _read_all(rfd, pid)
        _, status = os.waitpid(pid, 0)
        failed_op = next((OP_NAMES[v] for k, v in messages if k == b"F"), "nothing")
        what = f"error at FileOps call {n} ({failed_op}) of a compaction pass"
        assert not any(k == b"H" for k, _ in messages), f"{what}: hung"
        assert not os.WIFSIGNALED(status) and os.WEXITSTATUS(status) == 0, f"{what}: the process died"
        if failed_op == "nothing":
            total = next(v for k, v in messages if k == b"N")
        else:
            errors += 1
        check_compacted(str(work / "t-0"), history, what)
        shutil.rmtree(work)
        n += stride
    return errors


@pytest.mark.slow
def test_io_error_at_every_file_operation_of_a_compaction_pass(mem_path):
    assert _compaction_error_sweep(mem_path, 1) >= 20


def test_io_error_at_every_13th_file_operation_of_a_compaction_pass(mem_path):
    """The sweep above, sampled for make test's time budget (make soak runs every operation)."""
    assert _compaction_error_sweep(mem_path, 13) >= 2


@pytest.fixture(params=["ext4", "tmpfs"])
def small_disk(tmp_path, request):
    """A 16 MiB filesystem: ext4 on a loop device, or a tmpfs with a size limit (needs the right
    to mount, as root, and for ext4 mkfs.ext4 and a loop device; skipped where missing)."""
    import subprocess

    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if request.param == "ext4":
        image = tmp_path / "disk.img"
        with open(image, "wb") as f:
            f.truncate(16 << 20)
        commands = [["mkfs.ext4", "-q", "-F", str(image)], ["mount", "-o", "loop", str(image), str(mount_point)]]
    else:
        commands = [["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)]]
    for cmd in commands:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True)
        except FileNotFoundError:
            pytest.skip(f"{cmd[0]} is not installed")
        if done.returncode != 0:
            pytest.skip(f"cannot make a small {request.param} here ({' '.join(cmd[:2])}): {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def _fill(path, chunk=64 << 10):
    """Write a file until the filesystem is full (unbuffered: a buffered file would raise
    ENOSPC again from close, flushing the rest of the chunk that did not fit)."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\xff" * chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def _fill_then_append(path: str, wfd: int) -> None:
    with Log.open(path, segment_bytes=512 << 10) as log:
        acked = 0
        try:
            while True:
                log.append(b"r%07d" % acked + b"x" * 992)
                acked += 1
                os.write(wfd, _MSG.pack(b"A", acked - 1))
        except OSError:
            os.write(wfd, _MSG.pack(b"E", 0))
        try:
            log.append(b"after")
        except Exception:  # noqa: BLE001 - LogOfflineError expected
            os.write(wfd, _MSG.pack(b"O", 0))
        log._abandon()


def _reopen_on_a_full_disk(root: str, wfd: int) -> None:
    path = os.path.join(root, "t-0")
    with Log.open(path, segment_bytes=2 << 20) as log:
        log.append_batch([b"kept %d" % i for i in range(100)])
    _fill(os.path.join(root, "filler"))
    with Log.open(path, segment_bytes=2 << 20) as log:  # reserving append room fails: opens anyway
        assert [r.value for r in log.iter()] == [b"kept %d" % i for i in range(100)]
        try:
            log.append_batch([b"y" * 1000] * 64)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            os.write(wfd, _MSG.pack(b"E", 0))
    os.unlink(os.path.join(root, "filler"))
    with Log.open(path, segment_bytes=2 << 20) as log:
        assert log.append(b"room again") == 100
    os.write(wfd, _MSG.pack(b"N", 0))


def _run_child(target, *args):
    pid, rfd = _fork_quiet(target, *args)
    messages = _read_all(rfd, pid, timeout=60)
    _, status = os.waitpid(pid, 0)
    assert not os.WIFSIGNALED(status), f"the process died of {signal.Signals(os.WTERMSIG(status)).name}"
    assert os.WEXITSTATUS(status) == 0, "the child failed (see its traceback on stderr)"
    return messages


def test_a_real_full_disk_during_appends(small_disk):
    """ENOSPC from a real filesystem while appending: the appends that fit return, the one that
    does not raises (the process never dies of SIGBUS), the log goes offline, and every
    acknowledged record is there after a reopen once there is room."""
    path = str(small_disk / "t-0")
    messages = _run_child(_fill_then_append, path)
    acked = [v for k, v in messages if k == b"A"]
    assert (b"E", 0) in messages and (b"O", 0) in messages and len(acked) > 1000


@pytest.mark.regression(reason=("fixed: recovery on a full disk rebuilt the active segment's indexes into "
    "fresh sparse maps, and an index store into an unallocated page killed the process with SIGBUS; "
    "index blocks are now reserved with fallocate ahead of the appender and of the rebuild"))
def test_a_real_full_disk_keeps_acknowledged_appends(small_disk):
    """After a writer died on a full disk: reopening on the still-full disk raises ENOSPC (the
    process survives), and once some space is freed the reopen recovers every acknowledged record."""
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\xff" * (512 << 10))
    path = str(small_disk / "t-0")
    messages = _run_child(_fill_then_append, path)
    acked = [v for k, v in messages if k == b"A"]
    still_full = _run_child(_read_back, path)  # a child: a regression here would be a SIGBUS
    assert (b"F", 0) in still_full
    ballast.unlink()
    got = [v for k, v in _run_child(_read_back, path) if k == b"R"]
    assert len(acked) > 1000 and set(acked) <= set(got)


def _read_back(path: str, wfd: int) -> None:
    try:
        log = Log.open(path, segment_bytes=512 << 10)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
        os.write(wfd, _MSG.pack(b"F", 0))
        return
    with log:
        for r in log.iter():
            if r.value.startswith(b"r") and r.value[1:8].isdigit():
                os.write(wfd, _MSG.pack(b"R", int(r.value[1:8])))


@pytest.mark.regression(reason=("fixed: opening a log on a full disk failed with ENOSPC rewriting its "
    "checkpoint files, so it could not even be read; the checkpoint write at open is now best-effort. "
    "On a full tmpfs: the open died of SIGBUS counting the active index's entries through its map "
    "(reading a hole of a tmpfs file through a shared map allocates a page), and close raised "
    "ENOSPC writing the checkpoints after every segment was fsynced"))
def test_a_log_closed_before_the_disk_filled_opens_and_reads_on_the_full_disk(small_disk):
    messages = _run_child(_reopen_on_a_full_disk, str(small_disk))
    assert (b"E", 0) in messages and (b"N", 0) in messages


@pytest.mark.regression(reason=("fixed: an index reserved room for a number of entries that ended inside a "
    "page; on a file system with blocks smaller than a page (ext4 under 512 MiB: 1 KiB blocks) the first "
    "store into that page needs the page's other blocks too, and on a full disk that was a SIGBUS "
    "(seen once in CI, at the first index entry of a segment rolled while the disk filled)"))
def test_index_room_is_reserved_in_whole_pages(small_disk):
    messages = _run_child(_store_at_the_end_of_reserved_room, str(small_disk))
    assert (b"W", 0) in messages


def _exhaust_with_mapped_stores(path: str) -> None:
    """Take the blocks a full ext4 still keeps for page faults: a child stores into a sparse
    map until it dies of SIGBUS (write() stops with ENOSPC while a few hundred remain)."""
    import mmap

    pid = os.fork()
    if pid == 0:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT)
            os.ftruncate(fd, 8 << 20)
            mm = mmap.mmap(fd, 8 << 20)
            for off in range(0, 8 << 20, 1024):
                mm[off] = 1
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _store_at_the_end_of_reserved_room(root: str, wfd: int) -> None:
    from logstore.index import OffsetIndex

    index = OffsetIndex(os.path.join(root, "00000000000000000000.index"), 0, 1 << 20, True)
    index.reserve(100)  # 800 bytes: on 1 KiB blocks, one block of the first page's four
    _fill(os.path.join(root, "filler"))
    _exhaust_with_mapped_stores(os.path.join(root, "sparse"))
    index._mm[792:800] = struct.pack(">ii", 99, 4096)  # the last reserved slot
    os.write(wfd, _MSG.pack(b"W", 0))
    index.close()


# ---------------------------------------------------------------------------- retention and recovery
RETAINED = dict(CONFIG, segment_bytes=1024, index_interval_bytes=256, retention_bytes=2500)


def _segmented_template(root, unclean: bool) -> tuple[object, list[bytes]]:
    """``root/template/t-0``: 120 records over ~12 segments (every byte in the page cache, as
    after a SIGKILL). ``unclean``: no clean shutdown, a torn batch after the last record and a
    missing offset index, so that the open recovers, truncates and rebuilds."""
    path = root / "template"
    history: list[bytes] = []
    with _fileio.install(_NoSync()):
        log = Log.open(str(path / "t-0"), **RETAINED)
        append_some(log, history, "t", 120, random.Random(3))
        if unclean:
            active = log.segments[-1]
            base, size = active.base_offset, active.size
            log._abandon()
            stem = path / "t-0" / f"{base:020d}"
            with open(f"{stem}.log", "r+b") as f:
                f.seek(size)
                f.write(random.Random(4).randbytes(300))  # a torn write past the last batch
            sealed = sorted((path / "t-0").glob("*.index"))[-2]
            sealed.unlink()
        else:
            log.close()
    return path, history


def _append_one(log: Log, wfd: int) -> None:
    """Try one more append after the fault; report it if it returned (it is then acknowledged)."""
    try:
        end = log.log_end_offset
        if log.append(value_for(end, "t"), key=key_for(end)) == end:
            os.write(wfd, _MSG.pack(b"A", end))
    except Exception:  # noqa: BLE001 - the log may refuse writes after an I/O error
        pass


def _retention_with_error(path: str, how: str, fail_at: int, persistent: bool, wfd: int) -> None:
    """Open the log, run retention with the fail_at-th FileOps call of it failing, then try
    one append; report what returned."""
    with _fileio.install(_NoSync()):
        log = Log.open(path, **RETAINED)
    ops = _FailAtCall(fail_at, wfd)
    ops.persistent = persistent
    with _fileio.install(ops):
        try:
            if how == "enforce_retention":
                log.enforce_retention()
            else:
                log.delete_records_before(log.segments[5].base_offset + 3)
            os.write(wfd, _MSG.pack(b"R", log.log_start_offset))
        except Exception:  # noqa: BLE001 - a failed call is allowed; what it leaves is checked
            os.write(wfd, _MSG.pack(b"E", 0))
        _append_one(log, wfd)
    os.write(wfd, _MSG.pack(b"N", ops.calls))


def _recover_with_error(path: str, fail_at: int, persistent: bool, wfd: int) -> None:
    """Open (recover) an uncleanly shut down log with the fail_at-th FileOps call failing; if
    the open returns, append one record."""
    ops = _FailAtCall(fail_at, wfd)
    ops.persistent = persistent
    with _fileio.install(ops):
        try:
            log = Log.open(path, **RETAINED)
        except Exception:  # noqa: BLE001 - an open that hits an I/O error raises
            os.write(wfd, _MSG.pack(b"E", 0))
        else:
            _append_one(log, wfd)
    os.write(wfd, _MSG.pack(b"N", ops.calls))


def _sweep(mem_path, template, history: list[bytes], child, args: tuple, persistent: bool, stride: int,
           label: str) -> tuple[int, list[str]]:
    """Fail the 1st, (1 + stride)-th, ... FileOps call of ``child`` until it makes no more;
    after each, reopen with the plain FileOps and check the log. Returns (faults, failures)."""
    failures: list[str] = []
    n, total, faults = 1, None, 0
    while total is None or n <= total:
        work = mem_path / f"{label}{n}"
        shutil.copytree(template, work)
        pid, rfd = _fork_quiet(child, str(work / "t-0"), *args, n, persistent)
        messages = _read_all(rfd, pid)
        _, status = os.waitpid(pid, 0)
        failed_op = next((OP_NAMES[v] for k, v in messages if k == b"F"), "nothing")
        what = f"{label}: {'persistent ' if persistent else ''}error at FileOps call {n} ({failed_op})"
        try:
            assert not any(k == b"H" for k, _ in messages), f"{what}: hung"
            assert not os.WIFSIGNALED(status), f"{what}: died of {signal.Signals(os.WTERMSIG(status)).name}"
            assert os.WEXITSTATUS(status) == 0, f"{what}: failed (exit {os.WEXITSTATUS(status)}, see stderr)"
            if failed_op == "nothing":
                total = next(v for k, v in messages if k == b"N")
            else:
                faults += 1
            returned = [v for k, v in messages if k == b"R"]
            acked = [v for k, v in messages if k == b"A"]
            expected = history + [value_for(len(history), "t")]
            with _fileio.install(_NoSync()), Log.open(str(work / "t-0"), **RETAINED) as log:
                start = (returned[0], returned[0]) if returned else (0, len(history))
                check_log(log, expected, start, max([len(history)] + [a + 1 for a in acked]), random.Random(n), what)
        except Exception as exc:  # collect every failing point, report them together
            failures.append(_describe(exc, what))
        shutil.rmtree(work)
        n += stride
    return faults, failures


@pytest.mark.parametrize("depth", [pytest.param(3, id="every-3rd"), pytest.param(1, id="every", marks=pytest.mark.slow)])
@pytest.mark.parametrize("persistent", [False, True], ids=["once", "persistent"])
@pytest.mark.parametrize("how", ["enforce_retention", "delete_records_before"])
def test_io_error_at_every_file_operation_of_retention(mem_path, how, persistent, depth):
    """Retention that hits EIO/ENOSPC raises; the log then starts between where it started and
    where retention would have moved it, with nothing missing above its start; a call that
    returned has moved the start for good."""
    template, history = _segmented_template(mem_path, unclean=False)
    faults, failures = _sweep(mem_path, template, history, _retention_with_error, (how,), persistent, depth, how)
    assert not failures, f"{len(failures)} error points broke the log:\n" + "\n".join(failures)
    assert faults >= 30 // depth


@pytest.mark.parametrize("depth", [pytest.param(3, id="every-3rd"), pytest.param(1, id="every", marks=pytest.mark.slow)])
@pytest.mark.parametrize("persistent", [False, True], ids=["once", "persistent"])
def test_io_error_at_every_file_operation_of_recovery(mem_path, persistent, depth):
    """Recovery (torn tail truncated, a missing index rebuilt) that hits EIO/ENOSPC raises a
    clear exception without killing the process, and the next open recovers every record."""
    template, history = _segmented_template(mem_path, unclean=True)
    faults, failures = _sweep(mem_path, template, history, _recover_with_error, (), persistent, depth, "recover")
    assert not failures, f"{len(failures)} error points broke the log:\n" + "\n".join(failures)
    assert faults >= 60 // depth


def _append_into_reserved_room_on_an_exhausted_disk(root: str, wfd: int) -> None:
    path = os.path.join(root, "t-0")
    with Log.open(path, segment_bytes=1 << 20) as log:
        log.append(b"first")  # maps and reserves the segment's first growth step
        _fill(os.path.join(root, "filler"))
        _exhaust_with_mapped_stores(os.path.join(root, "sparse"))
        for i in range(500):  # ~500 kB into the room reserved before the disk filled
            log.append(b"%04d" % i + b"z" * 996)
        os.write(wfd, _MSG.pack(b"W", log.log_end_offset))
        log._abandon()


def test_appends_into_reserved_room_survive_an_exhausted_disk(small_disk):
    """Room reserved for a segment before the disk filled stays usable once it is full, even
    with the blocks ext4 keeps for page faults taken: appends into it do not fault."""
    messages = _run_child(_append_into_reserved_room_on_an_exhausted_disk, str(small_disk))
    assert (b"W", 501) in messages
