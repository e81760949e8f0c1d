"""A writer of transactions killed (SIGKILL) at every file operation, or losing power at every
sync point: after recovery every transaction is committed or aborted whole (or still open,
invisible), an acknowledged marker's outcome holds, and the ``.txnindex`` files, the last stable
offset and the open transactions equal a rebuild from the log alone.

The workload interleaves two producers' transactions in one partition (two batches each, then
a COMMIT or, every third, an ABORT marker), through segment rolls, so that markers, index
entries and producer snapshots are written at every kind of point. The parent reopens the log
and compares it with a copy stripped of everything derived (``.txnindex``, snapshots, the
checkpoints: a full replay from the first segment), and runs ``verify``.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import struct

import pytest

from logstore import Log, _fileio
from logstore.tools.verify import verify

from crashcheck import OP_NAMES, AtNthCall, NoSyncFileOps, fork_child
from crashcheck import describe as _describe
from powerloss import PowerLoss, PowerLossFileOps

_MSG = struct.Struct("<cq")
_ACK, _KILLED, _DONE = b"A", b"K", b"N"
CONFIG = dict(segment_bytes=900, index_interval_bytes=128)
TRANSACTIONS = 14


def values_of(i: int) -> list[bytes]:
    return [b"txn %d batch %d record %d" % (i, b, r) for b in range(2) for r in range(2)]


def committed(i: int) -> bool:
    return i % 3 != 1


def run_transaction(log: Log, i: int, sequences: dict[int, int]) -> None:
    pid = 1 + i % 2
    for b in range(2):
        batch = [b"txn %d batch %d record %d" % (i, b, r) for r in range(2)]
        log.append_batch(batch, producer_id=pid, producer_epoch=0, base_sequence=sequences[pid], transactional=True)
        sequences[pid] += 2
        if b == 0:
            log.append(b"plain after %d" % i)  # interleaved non-transactional records
    log.append_txn_marker(pid, 0, commit=committed(i), coordinator_epoch=1)


class _KillAtCall(AtNthCall):
    def at_nth(self, name, attr, args, kwargs):
        os.write(self.wfd, _MSG.pack(_KILLED, OP_NAMES.index(name)))
        os.kill(os.getpid(), signal.SIGKILL)


def _writer(path: str, kill_at: int, wfd: int) -> None:
    ops = _KillAtCall(kill_at, wfd)
    with _fileio.install(ops):
        log = Log.open(path, **CONFIG)
        sequences = {1: 0, 2: 0}
        for i in range(TRANSACTIONS):
            run_transaction(log, i, sequences)
            os.write(wfd, _MSG.pack(_ACK, i))
        log.close()
    os.write(wfd, _MSG.pack(_DONE, ops.calls))


def _stripped_copy(path: str, to: str) -> None:
    """``path`` without anything derived: a reopen replays every transaction from the log."""
    shutil.copytree(path, to)
    for name in os.listdir(to):
        if name.endswith((".txnindex", ".snapshot", ".kafka_cleanshutdown")):
            os.unlink(os.path.join(to, name))


def _state(log: Log) -> tuple:
    end = log.log_end_offset
    return (end, log.last_stable_offset, log.producer_transactions(),
            [(t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset)
             for t in log.aborted_transactions(0, end)],
            [(r.offset, r.value) for r in log.iter(isolation_level="read_committed")])


def _check(path: str, acked: int, what: str) -> None:
    with _fileio.install(NoSyncFileOps()):
        with Log.open(path, **CONFIG) as log:
            got = _state(log)
        rebuilt_dir = path + ".rebuilt"
        _stripped_copy(path, rebuilt_dir)
        with Log.open(rebuilt_dir, **CONFIG) as rebuilt:
            expected = _state(rebuilt)
        shutil.rmtree(rebuilt_dir)
        assert got == expected, f"{what}: the reopened log differs from a rebuild from its batches"
        report = verify(path)
        assert report.ok, f"{what}: verify: {[str(p) for p in report.problems]}"
    visible = {v for _, v in got[4]}
    for i in range(TRANSACTIONS):
        mine = set(values_of(i))
        seen = mine & visible
        assert not seen or seen == mine, f"{what}: transaction {i} is partly visible: {sorted(seen)}"
        if i <= acked:
            assert (seen == mine) == committed(i), f"{what}: acknowledged transaction {i} lost its outcome"


def _messages(rfd: int) -> bytes:
    out = bytearray()
    while chunk := os.read(rfd, 4096):
        out += chunk
    return bytes(out)


def _kill_at_every_call(mem_path, stride: int) -> list[str]:
    failures: list[str] = []
    n, total = 1, None
    while total is None or n <= total:
        work = mem_path / f"run{n}"
        work.mkdir()
        pid, rfd = fork_child(_writer, str(work / "t-0"), n)
        messages = _messages(rfd)
        os.close(rfd)
        _, status = os.waitpid(pid, 0)
        last = messages[-_MSG.size:]
        where = "end of the workload"
        if last[:1] == _DONE:
            total = _MSG.unpack(last)[1]
        else:
            assert last[:1] == _KILLED and os.WIFSIGNALED(status), f"kill point {n}: status {status:#x}"
            where = OP_NAMES[_MSG.unpack(last)[1]]
        acks = [_MSG.unpack_from(messages, i)[1] for i in range(0, len(messages), _MSG.size)
                if messages[i:i + 1] == _ACK]
        what = f"killed at FileOps call {n} ({where})"
        if (work / "t-0").exists():
            try:
                _check(str(work / "t-0"), acks[-1] if acks else -1, what)
            except Exception as exc:  # collect every failing kill point, then report them together
                failures.append(_describe(exc, what))
        shutil.rmtree(work)
        n += 1 if n < 30 else stride
    assert total is not None and total > 60, f"the workload made only {total} FileOps calls"
    return failures


@pytest.mark.parametrize("stride", [pytest.param(7, id="sampled"),
                                    pytest.param(1, id="every", marks=pytest.mark.slow)])
def test_sigkill_at_every_file_operation_leaves_every_transaction_whole(mem_path, stride):
    failures = _kill_at_every_call(mem_path, stride)
    assert not failures, f"{len(failures)} kill points broke a transaction:\n" + "\n".join(failures)


# ---------------------------------------------------------------------------- power loss
class _Lifetime:
    """Open, transactions through rolls, close, reopen, more, die, recover, more, close; every
    append durable on return (flush_messages=1)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.log: Log | None = None
        self.acked = -1
        self.sequences = {1: 0, 2: 0}

    def run(self) -> None:
        config = dict(CONFIG, flush_messages=1)
        for upto, ending in ((5, "close"), (10, "crash"), (TRANSACTIONS, "close")):
            self.log = Log.open(self.path, **config)
            for i in range(self.acked + 1, upto):
                run_transaction(self.log, i, self.sequences)
                self.acked = i
            if ending == "close":
                self.log.close()
            else:
                self.log._abandon()
            self.log = None


def _power_loss_at_every_sync(root, mode: str, seed: int, stride: int) -> tuple[list[str], int]:
    failures: list[str] = []
    n = 0
    while True:
        n += 1 if n < 30 else stride
        work = root / f"run{n}"
        ops = PowerLossFileOps(work)
        life = _Lifetime(str(work / "t-0"))
        with _fileio.install(ops):
            ops.schedule(n)
            try:
                life.run()
                done = True
            except PowerLoss:
                done = False
            if life.log is not None:
                life.log._abandon()
        if done:
            shutil.rmtree(work)
            return failures, n - 1
        _, kind, where = ops.events[-1]
        ops.crash(mode, random.Random(seed * 1000 + n))
        what = f"power lost at sync {n} ({kind} {where}, {mode})"
        # A transaction in flight when the power went may have lost its data (unsynced) and
        # kept nothing; every acknowledged one was durable when its marker returned.
        if (work / "t-0").exists():
            try:
                _check(str(work / "t-0"), life.acked, what)
            except Exception as exc:  # collect every failing crash point, then report them together
                failures.append(_describe(exc, what))
        shutil.rmtree(work)


@pytest.mark.parametrize(("mode", "seed", "stride"), [
    pytest.param("durable", 0, 3, id="durable-sampled"),
    pytest.param("torn", 1, 1, id="torn", marks=pytest.mark.slow)])
def test_power_loss_at_every_sync_point_leaves_every_transaction_whole(mem_path, mode, seed, stride):
    failures, points = _power_loss_at_every_sync(mem_path, mode, seed, stride)
    assert points > 40, f"the lifetime has only {points} sync points"
    assert not failures, f"{len(failures)} crash points broke a transaction:\n" + "\n".join(failures)
