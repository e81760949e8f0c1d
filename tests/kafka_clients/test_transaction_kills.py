"""``logstore serve`` killed (SIGKILL) at random points of a stream of transactions: after each
restart the coordinator finishes what it had decided and a new producer with the same
transactional id fences the old one (aborting its open transaction). In the end every
transaction is visible to read_committed whole or not at all, every acknowledged commit is
visible, nothing is left open (the last stable offset is the log end), and each partition's
``.txnindex`` equals a rebuild from its batches.

A few kill cycles by default; ``make soak`` runs many (``-m slow``)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaException, Producer  # noqa: E402

from logstore import Log, LogStore  # noqa: E402
from logstore.tools.verify import verify  # noqa: E402

TOPIC = "stream"
PER_PARTITION = 3


def serve(root: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "logstore", "serve", root, "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # "serving ROOT on HOST:PORT"
    assert line, "the server did not start"
    return proc, line.rsplit(" ", 1)[1].strip()


def values(cycle: int, k: int) -> list[bytes]:
    return [b"c%d-t%d-p%d-%d" % (cycle, k, p, i) for p in range(2) for i in range(PER_PARTITION)]


def transactions(bootstrap: str, cycle: int, acked: list[tuple[int, int]], stop: threading.Event) -> None:
    """Commit transactions (every fourth aborted) until the server dies or ``stop`` is set."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "kill-tx", "linger.ms": 1,
                  "message.timeout.ms": 5000, "transaction.timeout.ms": 5000, "socket.timeout.ms": 2000})
    try:
        p.init_transactions(10)
        k = 0
        while not stop.is_set():
            p.begin_transaction()
            for value in values(cycle, k):
                p.produce(TOPIC, value=value, partition=int(value.split(b"-p")[1][:1]))
            if k % 4 == 3:
                p.abort_transaction(5)
            else:
                p.commit_transaction(5)
                acked.append((cycle, k))
            k += 1
    except KafkaException:
        pass  # the server died under it


def settle(root: str, timeout: float = 20.0) -> None:
    """Serve once more until a fresh producer's init (fencing, aborting the open transaction)
    and the coordinator's markers leave nothing open."""
    proc, bootstrap = serve(root)
    try:
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "kill-tx"})
        p.init_transactions(20)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with LogStore(root, maintenance=False) as store:
                if all(store.partition(TOPIC, i).last_stable_offset == store.partition(TOPIC, i).log_end_offset
                       for i in range(2)):
                    return
            time.sleep(0.2)
        raise AssertionError("a transaction stayed open")
    finally:
        proc.terminate()
        proc.wait(30)


def _kill_cycles(tmp_path, cycles: int, seed: int) -> None:
    root = str(tmp_path / "store")
    with LogStore(root) as store:
        store.create_topic(TOPIC, 2)
    rng = random.Random(seed)
    acked: list[tuple[int, int]] = []
    for cycle in range(cycles):
        proc, bootstrap = serve(root)
        stop = threading.Event()
        worker = threading.Thread(target=transactions, args=(bootstrap, cycle, acked, stop))
        worker.start()
        time.sleep(rng.uniform(0.3, 1.5))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        stop.set()
        worker.join(60)
        assert not worker.is_alive()
    settle(root)
    with LogStore(root, maintenance=False) as store:
        visible = set()
        for i in range(2):
            log = store.partition(TOPIC, i)
            visible |= {r.value for r in log.iter(isolation_level="read_committed")}
        k_max = {}
        for v in visible:
            c, t = v.split(b"-")[:2]
            k_max[int(c[1:])] = max(k_max.get(int(c[1:]), 0), int(t[1:]))
        for cycle in range(cycles):
            for k in range(k_max.get(cycle, 0) + 2):
                mine = set(values(cycle, k))
                seen = mine & visible
                assert not seen or seen == mine, f"cycle {cycle} transaction {k} is partly visible: {sorted(seen)}"
                if k % 4 == 3:
                    assert not seen, f"aborted transaction {cycle}/{k} is visible"
        for cycle, k in acked:
            assert set(values(cycle, k)) <= visible, f"acknowledged commit {cycle}/{k} is not visible"
        paths = [store.partition(TOPIC, i).path for i in range(2)]
        aborted = [store.partition(TOPIC, i).aborted_transactions(0, store.partition(TOPIC, i).log_end_offset)
                   for i in range(2)]
    for path, entries in zip(paths, aborted):
        assert verify(path).ok, [str(p) for p in verify(path).problems]
        copy = path + ".rebuilt"
        shutil.copytree(path, copy)
        for name in os.listdir(copy):
            if name.endswith((".txnindex", ".snapshot", ".kafka_cleanshutdown")):
                os.unlink(os.path.join(copy, name))
        with Log.open(copy) as rebuilt:
            assert rebuilt.aborted_transactions(0, rebuilt.log_end_offset) == entries
            assert rebuilt.last_stable_offset == rebuilt.log_end_offset
    assert acked, "no transaction was acknowledged"


@pytest.mark.parametrize("cycles", [pytest.param(2, id="quick"),
                                    pytest.param(30, id="soak", marks=pytest.mark.slow)])
def test_serve_killed_in_a_stream_of_transactions_leaves_each_whole(tmp_path, cycles):
    _kill_cycles(tmp_path, cycles, seed=cycles)
