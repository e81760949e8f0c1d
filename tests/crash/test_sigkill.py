"""Kill a writer process with SIGKILL and check that the log it leaves behind is sound.

A SIGKILL loses nothing that reached the page cache: every append that returned must survive,
durable or not (an append's bytes are in the page cache, through the shared map or a pwrite,
before it returns). What may differ is the one append in flight, which survives whole or not at
all, and the appends that returned but whose acknowledgement had not yet reached the parent.

Each writer is forked from the test process (it imports nothing new), appends records whose
values encode their offset and the writer's tag (see crashcheck.py) and writes the last offset
of every append that returned to a pipe. The parent kills it at a random point -- after a
random number of acknowledgements, or at a random moment that may fall inside open/recovery --
reopens the log, checks it against the history of the acknowledged writes, appends more, and
leaves it (closed cleanly or abandoned) for the next writer. One log directory lives through all
the cycles, so every cycle also recovers a log that earlier cycles recovered.

A second family forks writers that kill themselves at the n-th call into the FileOps layer, for
every n of a fixed workload: every file operation boundary of open, append, roll, checkpoint
and close is a kill point once.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import struct
import time

import pytest

from logstore import Log, _fileio
from logstore._fileio import FileOps

from crashcheck import CONFIG, OP_NAMES, fork_child, AtNthCall, NoSyncFileOps, append_some, check_log, key_for, value_for
from crashcheck import describe as _describe

_MSG = struct.Struct("<cq")  # (kind, offset): b"O" opened at log end, b"A" acknowledged last offset
_ACK, _OPENED, _KILLED, _DONE = b"A", b"O", b"K", b"N"


# ---------------------------------------------------------------------------- the writer child
def _writer(path: str, config: dict, tag: str, seed: int, wfd: int) -> None:
    """Append forever, acknowledging each append's last offset on ``wfd`` after it returns."""
    rng = random.Random(seed)
    log = Log.open(path, **config)
    end = log.log_end_offset
    os.write(wfd, _MSG.pack(_OPENED, end))
    while True:
        k = rng.choice((1, 1, 1, 2, 5, 17))
        values = [value_for(end + i, tag) for i in range(k)]
        keys = [key_for(end + i) for i in range(k)]
        if k == 1 and rng.random() < 0.5:
            got = log.append(values[0], key=keys[0])
        else:
            got = log.append_batch(values, keys=keys)
        if got != end:
            raise AssertionError(f"append returned {got}, expected {end}")
        end += k
        os.write(wfd, _MSG.pack(_ACK, end - 1))
        if rng.random() < 0.01:
            log.roll()


def _read_messages(rfd: int, buffer: bytearray, want: int | None) -> bool:
    """Read messages into ``buffer`` until it holds ``want`` acknowledgements (None: until EOF).
    Returns False on EOF."""
    while True:
        if want is not None and _count_acks(buffer) >= want:
            return True
        chunk = os.read(rfd, 1 << 16)
        if not chunk:
            return False
        buffer += chunk


def _count_acks(buffer: bytearray) -> int:
    n = len(buffer) // _MSG.size
    return sum(1 for i in range(n) if buffer[i * _MSG.size] == _ACK[0])


def _parse(buffer: bytearray) -> tuple[int | None, int]:
    """(log end the writer opened at or None, one past the last acknowledged offset or -1)."""
    opened, last = None, -1
    for i in range(len(buffer) // _MSG.size):
        kind, offset = _MSG.unpack_from(buffer, i * _MSG.size)
        if kind == _OPENED:
            opened = offset
        else:
            assert offset > last, f"acknowledgements out of order: {offset} after {last}"
            last = offset
    return opened, last + 1 if last >= 0 else -1


def _kill_and_reap(pid: int) -> int:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _, status = os.waitpid(pid, 0)
    return status


def _run_kill_cycles(tmp_path, config: dict, cycles: int, max_acks: int, seed: int) -> dict:
    """The random-kill loop shared by the fsync and no-fsync variants; returns statistics."""
    rng = random.Random(seed)
    path = str(tmp_path / "logs" / "orders-0")
    history: list[bytes] = []
    start = 0
    stats = dict(killed_before_open=0, killed_before_first_ack=0, killed_after_acks=0, unacked_survivors=0,
                 clean_reopens=0)
    for cycle in range(cycles):
        tag = f"c{cycle}"
        pid, rfd = fork_child(_writer, path, config, tag, rng.getrandbits(32))
        buffer = bytearray()
        try:
            r = rng.random()
            if r < 0.1:
                # A random moment: often during open and recovery of the previous cycle's log.
                time.sleep(rng.uniform(0, 0.01))
            elif r < 0.2:
                # As soon as the log is open: inside the first append (and its fdatasync).
                while len(buffer) < _MSG.size:
                    chunk = os.read(rfd, _MSG.size - len(buffer))
                    assert chunk, "writer died on its own"
                    buffer += chunk
            else:
                alive = _read_messages(rfd, buffer, rng.randint(1, max_acks))
                assert alive, "writer died on its own"
                if rng.random() < 0.5:
                    time.sleep(rng.uniform(0, 0.002))
        finally:
            status = _kill_and_reap(pid)
        _read_messages(rfd, buffer, None)
        os.close(rfd)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
            f"cycle {cycle}: writer exited by itself with status {status:#x} (see captured stderr)")
        opened, acked_end = _parse(buffer)
        previous_end = len(history)
        if opened is None:
            stats["killed_before_open"] += 1
        else:
            assert opened == previous_end, (
                f"cycle {cycle}: the writer reopened the log at {opened}, but it ended at {previous_end}")
        if acked_end < 0:
            stats["killed_before_first_ack"] += 1
        else:
            stats["killed_after_acks"] += 1

        log = None
        with _fileio.install(NoSyncFileOps()):  # checking needs no durability, only speed
            try:
                log = Log.open(path, **config)
                what = f"cycle {cycle} (seed {seed})"
                end = log.log_end_offset
                assert end >= previous_end, f"{what}: log end {end} < {previous_end} before the writer started"
                # What the writer may have added: its own values from the previous end on.
                history.extend(value_for(o, tag) for o in range(previous_end, max(end, acked_end)))
                end = check_log(log, history, start, max(acked_end, previous_end), rng, what)
                stats["unacked_survivors"] += end - max(acked_end, previous_end)
                del history[end:]
                # The recovered log takes appends, at the right offsets, readable at once.
                append_some(log, history, f"p{cycle}", rng.randint(1, 5), rng)
                assert [r.value for r in log.iter(end)] == history[end:]
                if cycle % 5 == 4 and len(history) - start > 400:
                    # Bound the directory's growth (an unclean open fsyncs every segment); this
                    # also puts the log-start checkpoint under test.
                    start = log.delete_records_before(len(history) - 250)
                    assert start == len(history) - 250
            finally:
                if log is not None:
                    if rng.random() < 0.3:
                        log.close()  # the next writer opens a cleanly shut down log
                        stats["clean_reopens"] += 1
                    else:
                        log._abandon()  # the next writer finds an unclean shutdown
    return stats


def test_sigkill_at_random_points_keeps_every_acknowledged_fsynced_record(tmp_path):
    """120 writers with flush_messages=1 killed at random points, all in one log directory."""
    stats = _run_kill_cycles(tmp_path, dict(CONFIG, flush_messages=1), cycles=120, max_acks=30, seed=20240611)
    print(stats)
    # The random points must cover both kills mid-appends and kills before the first append.
    assert stats["killed_before_first_ack"] >= 3 and stats["killed_after_acks"] >= 60, stats


def test_sigkill_without_fsync_keeps_every_append_that_returned(tmp_path):
    """flush_messages=None: nothing is fsynced, yet the page cache keeps every returned append."""
    stats = _run_kill_cycles(tmp_path, dict(CONFIG, flush_messages=None), cycles=50, max_acks=200, seed=777)
    print(stats)
    assert stats["killed_after_acks"] >= 30, stats


# ---------------------------------------------------------------------------- kill at every I/O call


class _KillAtCall(AtNthCall):
    """SIGKILLs its own process when the n-th call into FileOps begins (after telling the
    parent which operation it was)."""

    def at_nth(self, name, attr, args, kwargs):
        os.write(self.wfd, _MSG.pack(_KILLED, OP_NAMES.index(name)))
        os.kill(os.getpid(), signal.SIGKILL)


def _scripted_writer(path: str, config: dict, kill_at: int, wfd: int) -> None:
    """Open, append 30 records (rolls included), close; die at FileOps call ``kill_at``.
    Finally reports the number of calls it made (for the enumeration's upper bound)."""
    rng = random.Random(5)
    ops = _KillAtCall(kill_at, wfd)
    with _fileio.install(ops):
        log = Log.open(path, **config)
        end = log.log_end_offset
        os.write(wfd, _MSG.pack(_OPENED, end))
        while end < 40 + 30:
            k = rng.choice((1, 1, 4))
            values = [value_for(end + i, "s") for i in range(k)]
            keys = [key_for(end + i) for i in range(k)]
            got = log.append(values[0], key=keys[0]) if k == 1 else log.append_batch(values, keys=keys)
            assert got == end
            end += k
            os.write(wfd, _MSG.pack(_ACK, end - 1))
        log.close()
    os.write(wfd, _MSG.pack(_DONE, ops.calls))


def _kill_at_every_call(mem_path, clean_template: bool, stride: int = 1) -> list[str]:
    """Run the scripted writer once per FileOps call index (every one of the open's first 60,
    then every ``stride``-th); return the failures."""
    config = dict(CONFIG, segment_bytes=1024, flush_messages=1)
    template = mem_path / "template"
    history: list[bytes] = []
    with _fileio.install(NoSyncFileOps()):
        log = Log.open(str(template / "t-0"), **config)
        append_some(log, history, "t", 40, random.Random(1))
        log.close() if clean_template else log._abandon()
    history.extend(value_for(o, "s") for o in range(40, 200))
    failures: list[str] = []
    n, total = 1, None
    while total is None or n <= total:
        work = mem_path / f"run{n}"
        shutil.copytree(template, work)
        pid, rfd = fork_child(_scripted_writer, str(work / "t-0"), config, n)
        buffer = bytearray()
        _read_messages(rfd, buffer, None)
        os.close(rfd)
        _, status = os.waitpid(pid, 0)
        where = "end of the workload"
        last = buffer[-_MSG.size:]
        if last[:1] == _DONE:
            total = _MSG.unpack(last)[1]
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        else:
            assert last[:1] == _KILLED and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
                f"kill point {n}: writer failed with status {status:#x} (see captured stderr)")
            where = OP_NAMES[_MSG.unpack(last)[1]]
        del buffer[-_MSG.size:]
        _, acked_end = _parse(buffer)
        what = f"killed at FileOps call {n} ({where})"
        try:
            with _fileio.install(NoSyncFileOps()), Log.open(str(work / "t-0"), **config) as log:
                end = check_log(log, history, 0, max(40, acked_end), random.Random(n), what)
                append_some(log, list(history[:end]), "after", 3, random.Random(n))
                end += 3
            with _fileio.install(NoSyncFileOps()), Log.open(str(work / "t-0"), **config) as log:
                assert log.log_end_offset == end, f"{what}: appends after recovery were lost by a clean close"
        except Exception as exc:  # collect every failing kill point, then report them together
            failures.append(_describe(exc, what))
        shutil.rmtree(work)
        n += 1 if n < 60 else stride
    assert total is not None and total > 150, f"the workload made only {total} FileOps calls"
    print(f"{total} FileOps calls, {len(failures)} failing kill points")
    return failures


#: make test kills at every fifth file operation after the open's first 60; make soak at every one.
STRIDES = [pytest.param(5, id="sampled"), pytest.param(1, id="every", marks=pytest.mark.slow)]


@pytest.mark.parametrize("stride", STRIDES)
def test_sigkill_at_every_file_operation_after_unclean_shutdown(mem_path, stride):
    failures = _kill_at_every_call(mem_path, clean_template=False, stride=stride)
    assert not failures, f"{len(failures)} kill points broke the log:\n" + "\n".join(failures)


@pytest.mark.regression(reason=("fixed: a process killed while opening a cleanly shut down log, after the active segment was "
    "re-mapped (fallocate + index preallocation) but before .kafka_cleanshutdown is unlinked, "
    "leaves a log whose next open trusts the marker and keeps the zero tail as data: appends go "
    "after the zeros and reading across them raises CorruptRecordError"))
@pytest.mark.parametrize("stride", STRIDES)
def test_sigkill_at_every_file_operation_after_clean_shutdown(mem_path, stride):
    failures = _kill_at_every_call(mem_path, clean_template=True, stride=stride)
    assert not failures, f"{len(failures)} kill points broke the log:\n" + "\n".join(failures)


def _die_before_marker_unlink(path: str, config: dict, wfd: int) -> None:
    class DieAtMarker(FileOps):
        def unlink(self, p: str) -> None:
            if p.endswith(".kafka_cleanshutdown"):
                os.kill(os.getpid(), signal.SIGKILL)
            super().unlink(p)

    with _fileio.install(DieAtMarker()):
        Log.open(path, **config)


@pytest.mark.regression(reason=("fixed: Log._load activates the last segment (fallocate grows the .log, indexes are "
    "preallocated) before unlinking .kafka_cleanshutdown; if the process dies in between, the "
    "next open takes the grown file size as data (segment.size includes the zero tail)"))
def test_sigkill_while_opening_a_cleanly_closed_log_keeps_it_readable_and_appendable(tmp_path):
    config = dict(CONFIG, flush_messages=1)
    path = str(tmp_path / "logs" / "t-0")
    history: list[bytes] = []
    with Log.open(path, **config) as log:
        append_some(log, history, "a", 10, random.Random(0))
        data_bytes = log.size_in_bytes
    pid, rfd = fork_child(_die_before_marker_unlink, path, config)
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status), "the writer was meant to die at the marker unlink"
    with Log.open(path, **config) as log:
        assert log.size_in_bytes == data_bytes, (
            f"the reopened log claims {log.size_in_bytes} bytes of batches; it holds {data_bytes}")
        check_log(log, history, 0, 10, what="first reopen")
        append_some(log, history, "b", 10, random.Random(1))
        check_log(log, history, 0, 20, what="after appending")
    with Log.open(path, **config) as log:
        check_log(log, history, 0, 20, what="second reopen")
