"""One writer per log: a second process opening the same log gets LogLockedError.

The lock is an ``flock`` on ``<partition>/.lock``, taken at open and released at close, or by
the kernel when the holder dies (SIGKILL included), so a crashed writer never blocks recovery.
The holder runs in a forked child that takes its orders through a pipe; the test process never
has the log open while it forks (a forked child would inherit the lock's open file description).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import traceback

import pytest

from logstore import Log, LogLockedError

from crashcheck import CONFIG, append_some, check_log, key_for, value_for


def _holder(path: str, orders: int, replies: int) -> None:
    """Open the log, append 5 records, say b"o"; on each b"a" append one more and say b"a";
    on b"c" close and say b"c"; then wait for EOF."""
    log = Log.open(path, **CONFIG)
    history: list[bytes] = []
    append_some(log, history, "h", 5, random.Random(0))
    os.write(replies, b"o")
    while True:
        order = os.read(orders, 1)
        if order == b"a":
            end = log.log_end_offset
            log.append(value_for(end, "h"), key=key_for(end))
            os.write(replies, b"a")
        elif order == b"c":
            log.close()
            os.write(replies, b"c")
        else:
            return


def _spawn_holder(path: str) -> tuple[int, int, int]:
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(to_child_w)
            os.close(to_parent_r)
            _holder(path, to_child_r, to_parent_w)
        except BaseException:
            traceback.print_exc(file=sys.stderr)
            code = 3
        finally:
            os._exit(code)
    os.close(to_child_r)
    os.close(to_parent_w)
    return pid, to_child_w, to_parent_r


def _ask(orders: int, replies: int, order: bytes) -> None:
    os.write(orders, order)
    assert os.read(replies, 1) == order, f"holder did not acknowledge {order!r}"


@pytest.fixture
def holder(tmp_path):
    path = str(tmp_path / "logs" / "orders-0")
    pid, orders, replies = _spawn_holder(path)
    assert os.read(replies, 1) == b"o", "holder failed to open the log"
    yield path, pid, orders, replies
    os.close(orders)
    os.close(replies)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass  # the test killed and reaped it


def test_second_process_gets_log_locked_error_until_the_holder_closes(holder):
    path, pid, orders, replies = holder
    with pytest.raises(LogLockedError, match="open for writing in another process"):
        Log.open(path, **CONFIG)
    # The refused open changed nothing: the holder still appends, and is still the only writer.
    _ask(orders, replies, b"a")
    with pytest.raises(LogLockedError):
        Log.open(path, **CONFIG)
    _ask(orders, replies, b"c")
    with Log.open(path, **CONFIG) as log:
        assert log.recovery_report.clean_shutdown
        history = [value_for(o, "h") for o in range(6)]
        check_log(log, history, 0, 6, what="after the holder closed")
        assert log.append(b"mine") == 6


def test_lock_of_a_sigkilled_holder_is_released_and_its_log_recovers(holder):
    path, pid, orders, replies = holder
    _ask(orders, replies, b"a")
    with pytest.raises(LogLockedError):
        Log.open(path, **CONFIG)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    with Log.open(path, **CONFIG) as log:
        assert not log.recovery_report.clean_shutdown
        history = [value_for(o, "h") for o in range(6)]
        check_log(log, history, 0, 6, what="after the holder was killed")
        assert log.append(b"mine") == 6
