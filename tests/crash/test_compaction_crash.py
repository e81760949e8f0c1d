"""Power loss at every sync point of a compaction pass: the log reads as before or after it.

The pass goes .cleaned -> .swap -> old segments .deleted -> .swap renamed live; a power cut at
any of its syncs (file and directory fsyncs, both checkpoint files) must leave, after the next
open, every key with its latest value, no offset twice, and nothing but records of the log
before the pass.
"""

from __future__ import annotations

import os
import random
import shutil

import pytest

from logstore import Log, _fileio
from crashcheck import COMPACTED, check_compacted, compacted_template, fork_child
from powerloss import PowerLoss, PowerLossFileOps

CONFIG = COMPACTED


# make soak: test_crash_explorer.py explores every sync of compaction passes in make test.
@pytest.mark.slow
@pytest.mark.parametrize("mode,seed", [("durable", 0), ("torn", 1), ("torn", 2)])
def test_power_loss_at_every_sync_of_a_compaction_pass(mem_path, mode, seed):
    template, history = compacted_template(mem_path)
    k = 0
    cut_points = 0
    while True:
        k += 1
        work = mem_path / f"k{k}"
        shutil.copytree(template, work)
        ops = PowerLossFileOps(work)
        finished = False
        with _fileio.install(ops):
            log = Log.open(str(work / "t-0"), **CONFIG)
            ops.schedule(k)
            try:
                log.compact()
                finished = True
            except PowerLoss:
                cut_points += 1
            log._abandon()
            ops.crash(mode, random.Random(seed * 1000 + k))
        check_compacted(str(work / "t-0"), history, f"cut {k}")
        shutil.rmtree(work)
        if finished:
            break
    assert cut_points >= 5  # the pass has at least the .cleaned, .swap, rename and checkpoint syncs


def _compact_and_die(path: str, kill_at: int, wfd: int) -> None:
    """Child process: open the log, run one compaction pass, SIGKILL itself at FileOps call
    ``kill_at``; if the pass ends first, report the number of calls and exit."""
    import os
    import signal
    import struct

    from crashcheck import OP_NAMES, AtNthCall

    class KillAt(AtNthCall):
        def at_nth(self, name, attr, args, kwargs):
            os.kill(os.getpid(), signal.SIGKILL)

    ops = KillAt(kill_at, wfd)
    with _fileio.install(ops):
        log = Log.open(path, **CONFIG)
        log.compact()
        log._abandon()
    os.write(wfd, struct.pack("<q", ops.calls))
    assert OP_NAMES  # the fault injector's vocabulary is the FileOps API


@pytest.mark.slow
def test_sigkill_at_every_file_operation_of_a_compaction_pass(mem_path):
    _sigkill_compaction_sweep(mem_path, stride=1, minimum_kills=20)


def test_sigkill_at_every_13th_file_operation_of_a_compaction_pass(mem_path):
    """The sweep above, sampled for make test's time budget (make soak runs every operation)."""
    _sigkill_compaction_sweep(mem_path, stride=13, minimum_kills=2)


def _sigkill_compaction_sweep(mem_path, stride: int, minimum_kills: int) -> None:
    import os
    import struct

    template, history = compacted_template(mem_path)
    n, total, kills = 1, None, 0
    while total is None or n <= total:
        work = mem_path / f"kill{n}"
        shutil.copytree(template, work)
        pid, rfd = fork_child(_compact_and_die, str(work / "t-0"), n)
        data = b""
        while chunk := os.read(rfd, 64):
            data += chunk
        os.close(rfd)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            kills += 1
        else:
            total = struct.unpack("<q", data[:8])[0]
        check_compacted(str(work / "t-0"), history, f"kill at call {n}")
        shutil.rmtree(work)
        n += stride
    assert kills >= minimum_kills  # every (stride-th) file operation of the open and the pass was a kill point


class _Crash(BaseException):
    """The process stopped at a file operation (nothing after it ran)."""


@pytest.mark.regression(reason=("fixed: swap_in renamed the new .txnindex live before the .log.swap; a crash "
    "between them left the new .txnindex next to the .log.swap, the open deleted it as the old one, "
    "aborted records became visible and the next pass deleted committed data"))
def test_a_crash_at_every_file_operation_of_a_pass_carrying_txnindex_entries(mem_path):
    from crashcheck import AtNthCall, build_transactional_compacted, check_transactional_compacted, TXN_COMPACTED

    class StopAt(AtNthCall):
        def at_nth(self, name, attr, args, kwargs):
            raise _Crash(name)

    template = mem_path / "template"
    history = build_transactional_compacted(str(template / "t-0"))
    with Log.open(str(template / "t-0"), **TXN_COMPACTED) as log:
        assert log.aborted_transactions(0, 100)  # the pass below carries this entry
    # Each pass runs in a forked child that stops at its n-th file operation and exits (its
    # descriptors, and the flocks they hold, go with it, as after a kill); the parent opens what
    # it left and checks it.
    n, crashes, finished = 1, set(), False
    while not finished:
        work = mem_path / f"stop{n}"
        shutil.copytree(template, work)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                log = Log.open(str(work / "t-0"), **TXN_COMPACTED)
                with _fileio.install(StopAt(n, -1)):
                    try:
                        report = log.compact()
                        code = 0 if (report.segments_cleaned, report.cleaned_up_to) == (1, 40) else 2
                    except _Crash as crash:
                        (work / "stopped-at").write_text(str(crash))
                        code = 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        assert code in (0, 3), f"the pass stopped at call {n} exited with {code}"
        finished = code == 0
        if not finished:
            crashes.add((work / "stopped-at").read_text())
        check_transactional_compacted(str(work / "t-0"), history, f"stopped at call {n}")
        shutil.rmtree(work)
        n += 1
    assert {"rename", "fsync_dir", "write_new_file", "unlink"} <= crashes
