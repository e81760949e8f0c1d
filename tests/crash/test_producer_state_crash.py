"""A writer of idempotent batches killed (SIGKILL) at every file operation, or losing power at
every sync point: the producer state the reopened log rebuilds still recognises the producer's
retries.

The writer opens a log that holds a producer's first batches, appends the next ones with
``Log.append_idempotent`` (segments roll, so producer snapshots are written at the rolls and at
the close) and dies at the n-th call into the FileOps layer, for every n (sampled in the default
run). The parent then plays the producer that did not hear the last answers: it retries the
last acknowledged batch, which must be a duplicate, and the batch in flight, which is appended
unless it landed; every batch must then be in the log exactly once, in order, and the producer
must be able to go on (and be recognised again after a clean reopen).

The power-loss variant (powerloss.py) lives through opens, appends with rolls, a clean close and
a process crash with ``flush_messages=1`` (every append durable when it returns), and is cut at
its 1st, 2nd, ... sync: the snapshots written at rolls and closes must never describe more than
the durable log, whatever the reboot kept of the work that was not synced.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct

import pytest

import random

from logstore import Log, _fileio
from logstore.records.batch import BatchBuilder

from crashcheck import OP_NAMES, AtNthCall, NoSyncFileOps, fork_child
from crashcheck import describe as _describe
from powerloss import PowerLoss, PowerLossFileOps

_MSG = struct.Struct("<cq")
_ACK, _KILLED, _DONE = b"A", b"K", b"N"
CONFIG = dict(segment_bytes=1024, index_interval_bytes=128)
PRODUCER = 77
TEMPLATE_BATCHES = 6
WORKLOAD_BATCHES = 12


def batch_for(i: int) -> bytes:
    """The producer's i-th batch: two records, sequences 2i and 2i+1."""
    values = [b"batch %d record %d " % (i, j) + b"." * 30 for j in range(2)]
    return bytes(BatchBuilder().build(values, producer_id=PRODUCER, producer_epoch=0, base_sequence=2 * i))


def expected_values(count: int) -> list[bytes]:
    return [b"batch %d record %d " % (i, j) + b"." * 30 for i in range(count) for j in range(2)]


class _KillAtCall(AtNthCall):
    def at_nth(self, name, attr, args, kwargs):
        os.write(self.wfd, _MSG.pack(_KILLED, OP_NAMES.index(name)))
        os.kill(os.getpid(), signal.SIGKILL)


def _writer(path: str, kill_at: int, wfd: int) -> None:
    ops = _KillAtCall(kill_at, wfd)
    with _fileio.install(ops):
        log = Log.open(path, **CONFIG)
        for i in range(TEMPLATE_BATCHES, TEMPLATE_BATCHES + WORKLOAD_BATCHES):
            assert not log.append_idempotent(batch_for(i)).duplicate
            os.write(wfd, _MSG.pack(_ACK, i))
        log.close()
    os.write(wfd, _MSG.pack(_DONE, ops.calls))


def _messages(rfd: int) -> bytes:
    out = bytearray()
    while chunk := os.read(rfd, 4096):
        out += chunk
    return bytes(out)


def _check(path: str, acked: int, what: str) -> None:
    """The producer retries what it did not hear about, then goes on."""
    with _fileio.install(NoSyncFileOps()):
        with Log.open(path, **CONFIG) as log:
            if acked >= 0:
                retry = log.append_idempotent(batch_for(acked))
                assert retry.duplicate and retry.first_offset == 2 * acked, f"{what}: the acknowledged batch: {retry}"
            in_flight = acked + 1
            got = log.append_idempotent(batch_for(in_flight))
            assert got.first_offset == 2 * in_flight, f"{what}: the batch in flight: {got}"
            assert [r.value for r in log.iter()] == expected_values(in_flight + 1), f"{what}: not once, in order"
            assert not log.append_idempotent(batch_for(in_flight + 1)).duplicate
        with Log.open(path, **CONFIG) as log:
            assert log.append_idempotent(batch_for(in_flight + 1)).duplicate, f"{what}: after a clean reopen"


def _kill_at_every_call(mem_path, clean_template: bool, stride: int) -> list[str]:
    template = mem_path / "template"
    with _fileio.install(NoSyncFileOps()):
        log = Log.open(str(template / "p-0"), **CONFIG)
        for i in range(TEMPLATE_BATCHES):
            log.append_idempotent(batch_for(i))
        log.close() if clean_template else log._abandon()
    failures: list[str] = []
    n, total = 1, None
    while total is None or n <= total:
        work = mem_path / f"run{n}"
        shutil.copytree(template, work)
        pid, rfd = fork_child(_writer, str(work / "p-0"), n)
        messages = _messages(rfd)
        os.close(rfd)
        _, status = os.waitpid(pid, 0)
        last = messages[-_MSG.size:]
        where = "end of the workload"
        if last[:1] == _DONE:
            total = _MSG.unpack(last)[1]
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        else:
            assert last[:1] == _KILLED and os.WIFSIGNALED(status), f"kill point {n}: status {status:#x}"
            where = OP_NAMES[_MSG.unpack(last)[1]]
        acks = [_MSG.unpack_from(messages, i)[1] for i in range(0, len(messages), _MSG.size)
                if messages[i:i + 1] == _ACK]
        acked = acks[-1] if acks else TEMPLATE_BATCHES - 1
        what = f"killed at FileOps call {n} ({where})"
        try:
            _check(str(work / "p-0"), acked, what)
        except Exception as exc:  # collect every failing kill point, then report them together
            failures.append(_describe(exc, what))
        shutil.rmtree(work)
        n += 1 if n < 40 else stride
    assert total is not None and total > 60, f"the workload made only {total} FileOps calls"
    return failures


#: The default run kills at every sixth file operation after the open's first 40, starting from
#: a cleanly closed log (every kill still leaves a crashed one for the parent to reopen); make
#: soak at every one, from a clean and from a crashed log.
CASES = [pytest.param(True, 6, id="sampled"),
         pytest.param(True, 1, id="every-after-clean-close", marks=pytest.mark.slow),
         pytest.param(False, 1, id="every-after-crash", marks=pytest.mark.slow)]


@pytest.mark.parametrize(("clean", "stride"), CASES)
def test_sigkill_at_every_file_operation_keeps_retries_recognised(mem_path, clean, stride):
    failures = _kill_at_every_call(mem_path, clean, stride)
    assert not failures, f"{len(failures)} kill points broke the producer state:\n" + "\n".join(failures)


# ---------------------------------------------------------------------------- power loss
class _Lifetime:
    """Open, append through rolls, close, reopen, append, die, recover, append, close; every
    append durable on return (flush_messages=1)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.log: Log | None = None
        self.acked = -1

    def _appends(self, upto: int) -> None:
        assert self.log is not None
        for i in range(self.acked + 1, upto):
            assert not self.log.append_idempotent(batch_for(i)).duplicate
            self.acked = i

    def run(self) -> None:
        config = dict(CONFIG, flush_messages=1)
        for upto, ending in ((10, "close"), (16, "crash"), (20, "close")):
            self.log = Log.open(self.path, **config)
            self._appends(upto)
            if ending == "close":
                self.log.close()
            else:
                self.log._abandon()
            self.log = None


def _power_loss_at_every_sync(root, mode: str, seed: int) -> tuple[list[str], int, set[str]]:
    """(failures, sync points, the files whose sync was cut)."""
    failures: list[str] = []
    cut: set[str] = set()
    n = 0
    while True:
        n += 1
        work = root / f"run{n}"
        ops = PowerLossFileOps(work)
        life = _Lifetime(str(work / "p-0"))
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
            return failures, n - 1, cut
        _, kind, where = ops.events[-1]
        cut.add(os.path.basename(where))
        ops.crash(mode, random.Random(seed * 1000 + n))
        what = f"power lost at sync {n} ({kind} {where}, {mode})"
        try:
            _check(str(work / "p-0"), life.acked, what)
        except Exception as exc:  # collect every failing crash point, then report them together
            failures.append(_describe(exc, what))
        shutil.rmtree(work)


@pytest.mark.parametrize(("mode", "seed"), [pytest.param("durable", 0, id="durable"),
                                            pytest.param("torn", 1, id="torn-1", marks=pytest.mark.slow),
                                            pytest.param("torn", 2, id="torn-2", marks=pytest.mark.slow)])
def test_power_loss_at_every_sync_point_keeps_retries_recognised(mem_path, mode, seed):
    failures, points, cut = _power_loss_at_every_sync(mem_path, mode, seed)
    assert points > 40, f"the lifetime has only {points} sync points"
    # The power went while a snapshot was written, at a roll and at a close.
    assert any(name.endswith(".snapshot.tmp") and name != "00000000000000000040.snapshot.tmp" for name in cut)
    assert "00000000000000000040.snapshot.tmp" in cut, sorted(cut)
    assert not failures, f"{len(failures)} crash points broke the producer state:\n" + "\n".join(failures)
