"""Replication: a 3-node replica set on loopback, each node its own process (``logstore node``).

Throughput: client threads produce batches of 1000 records of 200 bytes with acks="all" (the
call returns once a majority holds the batch); the same batches appended to a local Log in the
same run give the ratio. Failover: with the default timeouts (election timeout 1000 ms), the
leader is killed with SIGKILL while a client produces small acks="all" batches; the time from the
kill to the first acknowledged produce sent after it (necessarily by a new leader) is measured
over several kills, reported as p50 and p99.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import _report
from logstore import Log
from logstore.replication import Client, ReplicationError

VALUE = b"x" * 200
BATCH = [VALUE] * 1000
CLIENT_THREADS = 2
BATCHES_PER_THREAD = 100
FAILOVERS = int(os.environ.get("LOGSTORE_BENCH_FAILOVERS", "10"))
SECRET = b"bench-secret"
RESULTS: dict[str, float] = {}


class ProcessCluster:
    """Three ``logstore node`` processes on loopback ports, data under ``root``."""

    def __init__(self, root: str, election_timeout_ms: int | None = None) -> None:
        self.root = root
        socks = [socket.socket() for _ in range(3)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        self.addrs = {i: ("127.0.0.1", s.getsockname()[1]) for i, s in enumerate(socks)}
        for s in socks:
            s.close()
        self.secret_file = os.path.join(root, "secret")
        with open(self.secret_file, "wb") as f:
            f.write(SECRET)
        self.election_timeout_ms = election_timeout_ms
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, i: int) -> None:
        peers = [f"--peer={j}={h}:{p}" for j, (h, p) in self.addrs.items() if j != i]
        h, p = self.addrs[i]
        extra = [f"--election-timeout-ms={self.election_timeout_ms}"] if self.election_timeout_ms else []
        self.procs[i] = subprocess.Popen(
            [sys.executable, "-m", "logstore", "node", f"--node-id={i}", f"--data-dir={self.root}/n{i}",
             f"--listen={h}:{p}", f"--secret-file={self.secret_file}", *extra, *peers],
            stdout=subprocess.PIPE)
        assert b"serving" in self.procs[i].stdout.readline()

    def start_all(self) -> "ProcessCluster":
        for i in range(3):
            self.start(i)
        return self

    def client(self, timeout: float = 10.0) -> Client:
        return Client(list(self.addrs.values()), SECRET, timeout=timeout)

    def leader(self) -> int:
        """The node that says it leads (asking each node itself)."""
        while True:
            for i, address in self.addrs.items():
                if self.procs[i].poll() is not None:
                    continue
                probe = Client([address], SECRET, timeout=1)
                try:
                    if probe.metadata()[("replicated", 0)][0] == i:
                        return i
                except ReplicationError:
                    pass
                finally:
                    probe.close()
            time.sleep(0.05)

    def kill(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def scratch():
    path = tempfile.mkdtemp(prefix="bench-repl-", dir=os.environ.get("LOGSTORE_BENCH_DIR"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_local_append_same_batches(benchmark, scratch):
    """The baseline: the same 1000-record batches appended to one local Log (no fsync)."""
    benchmark.group = "replication"
    n = CLIENT_THREADS * BATCHES_PER_THREAD

    def setup():
        shutil.rmtree(os.path.join(scratch, "local"), ignore_errors=True)
        return (Log.open(os.path.join(scratch, "local")),), {}

    def run(log):
        for _ in range(n):
            log.append_batch(BATCH)
        log.close()

    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
    RESULTS["local"] = _report.report(benchmark, records=n * len(BATCH))


def test_replicated_produce_acks_all(benchmark, scratch):
    benchmark.group = "replication"
    cluster = ProcessCluster(scratch).start_all()
    clients = [cluster.client() for _ in range(CLIENT_THREADS)]
    try:
        clients[0].produce("replicated", 0, [b"warm-up"], acks="all")

        def run():
            def work(client):
                for _ in range(BATCHES_PER_THREAD):
                    client.produce("replicated", 0, BATCH, acks="all")

            threads = [threading.Thread(target=work, args=(c,)) for c in clients]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        benchmark.pedantic(run, rounds=3, iterations=1)
    finally:
        for c in clients:
            c.close()
        cluster.stop()
    rate = _report.report(benchmark, records=CLIENT_THREADS * BATCHES_PER_THREAD * len(BATCH), target=500_000,
                          note=f"3 processes, {CLIENT_THREADS} client threads, 1000 x 200 B per produce")
    if "local" in RESULTS:
        _report.report_value(benchmark, "replicated/local", rate / RESULTS["local"], "x",
                             note="same batches appended to a local Log")


def test_failover_time(benchmark, scratch):
    """SIGKILL the leader FAILOVERS times; each time, measure kill -> first acknowledged write."""
    benchmark.group = "replication"
    cluster = ProcessCluster(scratch).start_all()
    times: list[float] = []

    def run():
        client = cluster.client(timeout=10)
        try:
            client.produce("replicated", 0, [b"warm-up"], acks="all")
            for _ in range(FAILOVERS):
                leader = cluster.leader()
                for _ in range(20):  # writes flowing before the kill
                    client.produce("replicated", 0, [VALUE], acks="all")
                cluster.kill(leader)
                killed_at = time.monotonic()
                while True:
                    try:
                        client.produce("replicated", 0, [VALUE], acks="all", timeout=10)
                        break
                    except ReplicationError:
                        continue
                times.append(time.monotonic() - killed_at)
                cluster.start(leader)
        finally:
            client.close()

    try:
        benchmark.pedantic(run, rounds=1, iterations=1)
    finally:
        cluster.stop()
    times.sort()
    p50 = times[len(times) // 2]
    p99 = times[min(len(times) - 1, int(round(0.99 * (len(times) - 1))))]
    benchmark.extra_info["failover_s"] = times
    _report.report_value(benchmark, "failover p50", p50, "s", at_most=2.0, note=f"{len(times)} kills, default timeouts")
    _report.report_value(benchmark, "failover p99", p99, "s", at_most=2.0, note=f"max {times[-1]:.2f} s")
